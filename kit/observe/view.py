"""How a Report looks in a terminal: rich tables for status, one line per finding for health."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kit.observe.report import Report
from kit.observe.router import Latency, RouterStatus
from kit.observe.worker import WorkerStatus

STATE_STYLE = {
    "healthy": "green",
    "starting": "yellow",
    "draining": "cyan",
    "unhealthy": "bold red",
    "down": "bold red",
}
DASH = "-"

# Per role: (header, queue key in WorkerStatus.pd_queues) of the PD queues that role has.
ROLE_QUEUES = {
    "prefill": (("bootstrap q", "bootstrap"), ("in-flight q", "inflight")),
    "decode": (("prealloc q", "prealloc"), ("transfer q", "transfer")),
}


def duration(seconds: float | None) -> str:
    """45s, 12m03s, 3h12m, 2d04h."""
    if seconds is None:
        return DASH
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return DASH
    return f"{value:,.{digits}f}"


def percent(share: float | None) -> str:
    return DASH if share is None else f"{share:.0%}"


def _state(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def _engine(worker: WorkerStatus) -> str:
    if worker.engine is None:
        return DASH
    return f"{worker.engine} {worker.version}" if worker.version else worker.engine


def _failures(worker: WorkerStatus) -> Text:
    kv = worker.kv
    if kv.failed is None and kv.bootstrap_failed is None:
        return Text(DASH)
    failed, bootstrap = kv.failed or 0, kv.bootstrap_failed or 0
    text = f"{failed}" if not bootstrap else f"{failed} (+{bootstrap} bootstrap)"
    return Text(text, style="bold red" if failed or bootstrap else "")


def role_table(role: str, workers: list[WorkerStatus]) -> Table:
    """One table per role: a row per instance."""
    table = Table(title=f"{role} ({len(workers)})", title_justify="left", expand=False)
    for header in ("instance", "host:port", "state", "engine", "uptime", "running", "queued"):
        table.add_column(header, no_wrap=True)
    table.add_column("KV cache", justify="right")
    for header, _ in ROLE_QUEUES[role]:
        table.add_column(header, justify="right")
    table.add_column("KV xfer ms", justify="right")
    table.add_column("xfer failed", justify="right")
    table.add_column("gen tok/s", justify="right")
    for w in workers:
        name = w.name if w.nnodes == 1 else f"{w.name} ({w.nnodes} nodes)"
        table.add_row(
            name,
            w.endpoint,
            _state(w.state),
            _engine(w),
            duration(w.uptime_s),
            number(w.running),
            number(w.queued),
            percent(w.token_usage),
            *(number(w.pd_queues.get(key)) for _, key in ROLE_QUEUES[role]),
            number(w.kv.latency_ms, 1),
            _failures(w),
            number(w.gen_throughput, 1),
        )
    return table


def _latency(label: str, lat: Latency | None) -> str:
    if lat is None:
        return f"{label} {DASH}"
    parts = "/".join(number(v, 0) for v in (lat.p50_ms, lat.p90_ms, lat.p99_ms))
    return f"{label} p50/p90/p99 {parts} ms"


def router_lines(router: RouterStatus) -> Text:
    """Two lines: who and what state; then traffic, latency and the SLO."""
    text = Text()
    text.append("router ", style="bold")
    text.append(f"{router.kind} {router.endpoint} ")
    text.append_text(_state(router.state))
    if router.ready is not None:
        text.append(
            "  ready" if router.ready else "  not ready", style="" if router.ready else "red"
        )
    for role in ("prefill", "decode"):
        healthy = getattr(router, f"healthy_{role}")
        total = getattr(router, f"total_{role}")
        if healthy is not None:
            style = "red" if healthy == 0 else ""
            text.append(f"  {role} {healthy}/{total if total is not None else '?'} healthy", style)
    if router.cause and router.state != "healthy":
        text.append(f"  ({router.cause})", style="red")
    text.append("\n       ")
    if router.requests_per_s is not None and router.rate_window_s:
        text.append(f"{router.requests_per_s:.1f} req/s over {router.rate_window_s:.1f} s")
    else:
        text.append(f"{DASH} req/s")
    if router.requests_total is not None:
        text.append(f" ({router.requests_total:,} requests)")
    if router.inflight is not None:
        text.append(f"  {router.inflight} in flight")
    tpot_label = "ITL" if router.tpot_is_itl else "TPOT"
    text.append(f"  {_latency('TTFT', router.ttft)}  {_latency(tpot_label, router.tpot)}")
    shares = [
        f"{label}<={lat.limit_ms:g}ms {percent(lat.within)}"
        for label, lat in (("TTFT", router.ttft), (tpot_label, router.tpot))
        if lat is not None
    ]
    if shares:
        verdict = {True: "met", False: "missed", None: ""}[router.slo_met]
        style = {True: "green", False: "bold red", None: ""}[router.slo_met]
        text.append(f"  within SLO ({router.latency_window}): {', '.join(shares)} ")
        text.append(f"target {router.slo_attainment:.0%} {verdict}", style=style)
    return text


def status_view(report: Report) -> RenderableType:
    """The whole status screen."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.taken_at))
    states: dict[str, int] = {}
    for w in report.workers:
        states[w.state] = states.get(w.state, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    head = Text()
    head.append(f"{report.deployment}", style="bold")
    head.append(
        f"  {len(report.workers)} workers: {summary or 'none'}  "
        f"(probed in {report.probe_s:.2f} s, timeout {report.timeout_s:g} s, {when})"
    )
    parts: list[RenderableType] = [head, router_lines(report.router)]
    for role in ("prefill", "decode"):
        mine = [w for w in report.workers if w.role == role]
        if mine:
            parts.append(role_table(role, mine))
    if report.problems:
        parts.append(Text("problems:", style="bold red"))
        parts += [Text(f"  {f}") for f in report.problems]
    if report.warnings:
        parts.append(Text("warnings:", style="yellow"))
        parts += [Text(f"  {f}") for f in report.warnings]
    if not report.problems:
        parts.append(Text("all healthy", style="green"))
    return Group(*parts)


def health_lines(report: Report) -> list[str]:
    """`pdkit health` output: OK line, or one line per problem; warnings after, marked."""
    lines = [str(f) for f in report.problems]
    if not lines:
        lines.append(
            f"OK: {report.deployment}: {len(report.workers)} workers and the "
            f"{report.router.kind} router are healthy"
        )
    lines += [f"warning: {f}" for f in report.warnings]
    return lines
