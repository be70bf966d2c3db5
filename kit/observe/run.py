"""The `pdkit health` and `pdkit status` commands: probe rounds, reports, output.

The CLI parses options and calls `health` or `status` here with the resolved Plan; this module
owns the event loop, the one `Prober` (one connection pool for every round of `--watch`), and
where the output goes (a rich Console, or JSON on stdout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from kit.errors import ProbeError
from kit.observe.probe import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TIMEOUT_S,
    Fetched,
    Prober,
    ReplicaAnswers,
    Round,
)
from kit.observe.replicas import ReplicasView, evaluate_replicas
from kit.observe.report import Report, build_report, report_to_json
from kit.observe.targets import Targets, targets_from_plan
from kit.observe.view import health_lines, status_view
from kit.topology.plan_types import Plan

DEFAULT_INTERVAL_S = 2.0
DEFAULT_RATE_WINDOW_S = 1.0
TABLE_WIDTH = 180


@dataclass(frozen=True)
class ProbeOptions:
    """`timeout_s` per request; at most `concurrency` requests in flight."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    concurrency: int = DEFAULT_CONCURRENCY


async def probe_once(targets: Targets, options: ProbeOptions, rate_window_s: float = 0.0) -> Report:
    """One round over every worker and the router (rates need `rate_window_s` > 0)."""
    async with Prober(options.timeout_s, options.concurrency) as prober:
        now = await prober.round(targets, rate_window_s)
    return build_report(targets, now, timeout_s=options.timeout_s)


async def watch_reports(
    targets: Targets,
    options: ProbeOptions,
    interval_s: float,
    on_report: Callable[[Report], None],
    count: int | None = None,
) -> None:
    """A round every `interval_s` seconds (or back to back when a round takes longer), each
    compared with the one before for rates and windowed latencies; stops after `count`."""
    if interval_s <= 0:
        raise ProbeError(f"--interval must be > 0 s, got {interval_s:g}")
    async with Prober(options.timeout_s, options.concurrency) as prober:
        earlier: Round | None = None
        done = 0
        while count is None or done < count:
            started = time.monotonic()
            # The first round takes a second scrape of the router for a request rate at once.
            window = min(DEFAULT_RATE_WINDOW_S, interval_s) if earlier is None else 0.0
            now = await prober.round(targets, window)
            on_report(
                build_report(
                    targets, now, earlier, timeout_s=options.timeout_s, latency_over_window=True
                )
            )
            earlier, done = now, done + 1
            if count is not None and done >= count:
                break
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def _plain(console: Console, text: str) -> None:
    """Print exactly `text` (JSON, lines for scripts): no markup, emoji, highlighting or wrap."""
    console.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)


Extra = Callable[[], tuple[str, dict[str, Any]] | None]
"""A section a layer above adds to each status screen (e.g. the autoscaler's last decision, the
Slurm job): its lines for the screen and its keys for --json (merged into the report's object),
None when it has nothing to say."""


def _json(report: Report, extra: Extra | None = None) -> str:
    data = report_to_json(report)
    found = extra() if extra else None
    if found is not None:
        data = {**data, **found[1]}
    return json.dumps(data, separators=(",", ":"))


def _screen(report: Report, extra: Extra | None = None) -> RenderableType:
    found = extra() if extra else None
    if found is None:
        return status_view(report)
    return Group(status_view(report), Text(found[0]))


def _for_tables(console: Console) -> Console:
    """Piped output gets a wide page: a status table squeezed to 80 columns is unreadable."""
    if console.is_terminal or console.width >= TABLE_WIDTH:
        return console
    return Console(file=console.file, width=TABLE_WIDTH, highlight=False, soft_wrap=True)


def health(plan: Plan, console: Console, options: ProbeOptions, as_json: bool = False) -> int:
    """Probe once; print one line per problem (or OK); return the exit status (0 = healthy)."""
    report = asyncio.run(probe_once(targets_from_plan(plan), options))
    if as_json:
        _plain(console, _json(report))
    else:
        for line in health_lines(report):
            _plain(console, line)
    return 0 if report.healthy else 1


def replica_checks(plan: Plan, options: ProbeOptions) -> ReplicasView | None:
    """`pdkit doctor`'s look at the router's replicas and VIP (router.hosts), once; None with
    one router."""
    if not plan.router_hosts:
        return None
    targets = targets_from_plan(plan)

    async def ask() -> tuple[tuple[ReplicaAnswers, ...], Fetched | None]:
        async with Prober(options.timeout_s, options.concurrency) as prober:
            return await prober.replicas(targets)

    answers, vip = asyncio.run(ask())
    return evaluate_replicas(answers, vip, targets.vip_url, plan.router.log_path)


def status(
    plan: Plan,
    console: Console,
    options: ProbeOptions,
    *,
    as_json: bool = False,
    watch: bool = False,
    interval_s: float = DEFAULT_INTERVAL_S,
    count: int | None = None,
    extra: Extra | None = None,
) -> int:
    """Show the status once, or refresh it in place every `interval_s` with `watch` (Ctrl-C
    stops; `count` stops after that many refreshes). With `as_json` and `watch`, one JSON
    object per line per refresh. Returns 0: status reports, `health` judges."""
    targets = targets_from_plan(plan)
    if not watch:
        report = asyncio.run(probe_once(targets, options, DEFAULT_RATE_WINDOW_S))
        if as_json:
            _plain(console, _json(report, extra))
        else:
            _for_tables(console).print(_screen(report, extra))
        return 0
    live: Live | None = None
    wide = _for_tables(console)

    def show(report: Report) -> None:
        if as_json:
            _plain(console, _json(report, extra))
        elif live is not None:
            live.update(_screen(report, extra), refresh=True)
        else:  # piped: one screen after the other
            wide.print(_screen(report, extra), "\n")

    with contextlib.ExitStack() as stack:
        if console.is_terminal and not as_json:
            live = stack.enter_context(Live(console=console, auto_refresh=False))
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends --watch
            asyncio.run(watch_reports(targets, options, interval_s, show, count))
    return 0
