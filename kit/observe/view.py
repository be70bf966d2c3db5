"""How a Report looks in a terminal: rich tables for status, one line per finding for health."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kit.observe.kvpool import kv_pool_line
from kit.observe.report import Report
from kit.observe.router import Latency, RouterStatus
from kit.observe.worker import WorkerStatus

STATE_STYLE = {
    "healthy": "green",
    "starting": "yellow",
    "draining": "cyan",
    "joining": "cyan",
    "unhealthy": "bold red",
    "down": "bold red",
}
DASH = "-"


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
    text = f"{failed}" if not bootstrap else f"{failed}+{bootstrap}b"
    return Text(text, style="bold red" if failed or bootstrap else "")


def _name(worker: WorkerStatus) -> str:
    if worker.nnodes == 1 or worker.node_rank:  # another node is named as its process
        return worker.name
    return f"{worker.name} ({worker.nnodes} nodes)"


@dataclass(frozen=True)
class Column:
    """A worker table column: short `header`, what it means (`legend`), the cell of a worker."""

    header: str
    legend: str
    cell: Callable[[WorkerStatus], str | Text]
    numeric: bool = True


def _queue(key: str) -> Callable[[WorkerStatus], str]:
    return lambda w: number(w.pd_queues.get(key))


COLUMNS = {
    "instance": Column("instance", "", _name, numeric=False),
    "endpoint": Column("host:port", "", lambda w: w.endpoint, numeric=False),
    "state": Column("state", "", lambda w: _state(w.state), numeric=False),
    "engine": Column("engine", "", _engine, numeric=False),
    "uptime": Column(
        "up",
        "up: uptime (-: not reported, as by SGLang)",
        lambda w: duration(w.uptime_s),
        numeric=False,
    ),
    "running": Column("run", "run/queue: requests running/waiting", lambda w: number(w.running)),
    "queued": Column("queue", "", lambda w: number(w.queued)),
    "kv": Column("KV%", "KV%: KV cache used", lambda w: percent(w.token_usage)),
    "bootstrap": Column("boot q", "boot q: waiting for their decode", _queue("bootstrap")),
    "inflight": Column("send q", "send q: sending KV", _queue("inflight")),
    "prealloc": Column("alloc q", "alloc q: waiting for KV room", _queue("prealloc")),
    "transfer": Column("recv q", "recv q: receiving KV", _queue("transfer")),
    "xfer_ms": Column(
        "xfer ms",
        "xfer ms: mean KV transfer (-: SGLang's decode reports none)",
        lambda w: number(w.kv.latency_ms, 1),
    ),
    "failed": Column("fail", "fail: failed KV transfers (+b bootstraps)", _failures),
    "tokens": Column("tok/s", "tok/s: tokens generated", lambda w: number(w.gen_throughput, 1)),
}
ROLE_PRIORITY = {
    "prefill": (
        "instance",
        "state",
        "running",
        "queued",
        "bootstrap",
        "inflight",
        "xfer_ms",
        "failed",
        "kv",
        "endpoint",
        "uptime",
        "engine",
        "tokens",
    ),
    "decode": (
        "instance",
        "state",
        "running",
        "queued",
        "prealloc",
        "transfer",
        "kv",
        "tokens",
        "xfer_ms",
        "failed",
        "endpoint",
        "uptime",
        "engine",
    ),
}
"""Per role, its columns from the one kept longest to the first left out on a narrow terminal."""
DISPLAY_ORDER = (
    "instance", "endpoint", "state", "engine", "uptime", "running", "queued", "kv",
    "bootstrap", "inflight", "prealloc", "transfer", "xfer_ms", "failed", "tokens",
)  # fmt: skip


def _table(role: str, workers: list[WorkerStatus], keys: list[str]) -> Table:
    table = Table(
        title=f"{role} ({len(workers)})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        expand=False,
    )
    shown = [k for k in DISPLAY_ORDER if k in keys]
    for key in shown:
        column = COLUMNS[key]
        table.add_column(column.header, justify="right" if column.numeric else "left", no_wrap=True)
    for w in workers:
        table.add_row(*(COLUMNS[key].cell(w) for key in shown))
    return table


def _width(console: Console, options: ConsoleOptions, table: Table) -> int:
    return Measurement.get(console, options.update_width(10_000), table).maximum


def role_table(
    console: Console, options: ConsoleOptions, role: str, workers: list[WorkerStatus]
) -> tuple[Table, list[str]]:
    """The role's table with as many of its columns as fit `options.max_width` (the least
    important left out first; the engine column only when workers differ in it), and the keys
    of the columns left out."""
    keys = list(ROLE_PRIORITY[role])
    if len({_engine(w) for w in workers}) <= 1:
        keys.remove("engine")  # said once, in the head line
    left_out: list[str] = []
    table = _table(role, workers, keys)
    while len(keys) > 2 and _width(console, options, table) > options.max_width:
        left_out.insert(0, keys.pop())
        table = _table(role, workers, keys)
    return table, left_out


def legend(keys: set[str]) -> Text:
    """What the short headers of the shown columns mean."""
    seen: list[str] = []
    for key in DISPLAY_ORDER:
        text = COLUMNS[key].legend
        if key in keys and text and text not in seen:
            seen.append(text)
    return Text(" · ".join(seen), style="dim")


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
    if router.processes:
        running = sum(p.running for p in router.processes)
        style = "" if running == len(router.processes) else "red"
        text.append(f"  {running}/{len(router.processes)} processes", style)
        text.append(
            " (" + ", ".join(f"pid {p.pid}: {p.served:,} served" for p in router.processes) + ")"
        )
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
    if router.canary_pairs:
        text.append("\n       token canary: ")
        if router.canary_wrong:
            for prefill, decode in router.canary_wrong:
                text.append(
                    f"prefill {prefill.removeprefix('http://')} x decode "
                    f"{decode.removeprefix('http://')} gives wrong tokens  ",
                    style="bold red",
                )
        else:
            text.append(f"all {router.canary_pairs} pairs agree", style="green")
    for kv in router.kv_index:
        text.append(f"\n       KV index {kv.worker.removeprefix('http://')}: ")
        text.append(f"{kv.blocks:,} blocks")
        if not kv.live:
            text.append(" (not live: routing without it)", style="yellow")
        text.append(f"  hit rate {percent(kv.hit_rate)}")
        if kv.predictions:
            text.append(
                f"  predictions agreed {kv.agreed / kv.predictions:.0%} "
                f"({kv.agreed}/{kv.predictions})"
            )
    return text


class StatusScreen:
    """The whole status screen, laid out for the width it is given: each role's table keeps
    its most important columns when the terminal is narrow, and says which it left out."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for part in self._parts(console, options):
            if isinstance(part, Text):  # wrapped at words, also where the console soft-wraps
                yield from part.wrap(console, options.max_width)
            else:
                yield part

    def _parts(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        report = self.report
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.taken_at))
        states: dict[str, int] = {}
        for w in report.workers:
            states[w.state] = states.get(w.state, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        engines = sorted({_engine(w) for w in report.workers} - {DASH})
        head = Text()
        head.append(f"{report.deployment}", style="bold")
        head.append(f"  {len(report.workers)} workers: {summary or 'none'}")
        if len(engines) == 1:
            head.append(f", {engines[0]}")
        head.append(f"  (probed in {report.probe_s:.2f} s, timeout {report.timeout_s:g} s, {when})")
        yield head
        yield router_lines(report.router)
        for part in (*report.replicas, *((report.vip,) if report.vip else ())):
            yield Text(f"  {part.line()}", style="" if part.ok else "red")
        if report.kv_pool is not None:
            style = "red" if report.kv_pool.state == "down" else ""
            yield Text(kv_pool_line(report.kv_pool), style=style)
        shown: set[str] = set()
        for role in ("prefill", "decode"):
            mine = [w for w in report.workers if w.role == role]
            if not mine:
                continue
            table, left_out = role_table(console, options, role, mine)
            yield table
            shown |= {k for k in ROLE_PRIORITY[role] if k not in left_out}
            if left_out:
                names = ", ".join(COLUMNS[k].header for k in left_out)
                yield Text(f"  (not shown at {options.max_width} columns: {names})", style="dim")
        yield legend(shown)
        if report.problems:
            yield Text("problems:", style="bold red")
            yield from (Text(f"  {f}") for f in report.problems)
        if report.warnings:
            yield Text("warnings:", style="yellow")
            yield from (Text(f"  {f}") for f in report.warnings)
        if not report.problems:
            yield Text("all healthy", style="green")


def status_view(report: Report) -> RenderableType:
    """The whole status screen (laid out for the console's width when printed)."""
    return StatusScreen(report)


def health_lines(report: Report) -> list[str]:
    """`pdkit health` output: OK line, or one line per problem; warnings after, marked."""
    lines = [str(f) for f in report.problems]
    if not lines:
        replicas = f" ({len(report.replicas)} replicas)" if report.replicas else ""
        vip = f", its VIP {report.vip.endpoint} answers" if report.vip else ""
        lines.append(
            f"OK: {report.deployment}: {len(report.workers)} workers and the "
            f"{report.router.kind} router{replicas} are healthy{vip}"
        )
    lines += [f"warning: {f}" for f in report.warnings]
    return lines
