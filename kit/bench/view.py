"""What `pdkit bench` prints: a live line while a point runs, a table of the points, notes."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kit.bench.metrics import CacheSummary, Percentiles, PointSummary
from kit.bench.runner import Progress


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _triple(p: Percentiles) -> str:
    return "/".join(_ms(v) for v in (p.p50, p.p90, p.p99))


class PointLine:
    """A one-line live view of the point in progress (nothing when not on a terminal)."""

    def __init__(self, console: Console, label: str) -> None:
        self.console = console
        self.label = label
        self._live: Live | None = None

    def __enter__(self) -> PointLine:
        if self.console.is_terminal:
            self._live = Live(console=self.console, transient=True, refresh_per_second=8)
            self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)

    def update(self, progress: Progress) -> None:
        if self._live is None:
            return
        done = progress.done
        share = f"{progress.good / done:.0%}" if done else "-"
        self._live.update(
            Text(
                f"  {self.label}: {done}/{progress.total} done, {progress.sent - done} in flight, "
                f"{progress.failed} failed, attainment so far {share}"
            )
        )


def point_line(summary: PointSummary) -> str:
    """One line per finished point, for logs and non-terminals."""
    return (
        f"  {summary.label}: {summary.requests} requests, {summary.ok} ok, attainment "
        f"{summary.attainment:.1%}, goodput {summary.goodput:.2f} req/s, TTFT p90 "
        f"{_ms(summary.ttft_ms.p90)} ms, TPOT p90 {_ms(summary.tpot_ms.p90)} ms"
    )


def points_table(summaries: Sequence[PointSummary], title: str) -> Table:
    """The points of a run in 80 columns: load, answered, attainment, goodput, and the
    latency percentiles (p50/p90/p99, ms). Throughput, tokens/s and ITL are in summary.json."""
    table = Table(
        title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for name in ("load", "ok/sent", "attain", "good/s", "TTFT p50/90/99", "TPOT p50/90/99"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in summaries:
        met = s.attainment_met
        table.add_row(
            s.label,
            Text(f"{s.ok}/{s.requests}", style="red" if s.ok < s.requests else ""),
            Text(f"{s.attainment:.1%}", style="" if met is None else ("green" if met else "red")),
            f"{s.goodput:.2f}",
            _triple(s.ttft_ms),
            _triple(s.tpot_ms),
        )
    return table


def more_table(summaries: Sequence[PointSummary]) -> Table:
    """The rest of each point in 80 columns: throughput, output tokens/s, inter-token and
    end-to-end latency percentiles (ms), and errors."""
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("load", "thru/s", "tok/s", "ITL p50/90/99", "E2E p50/90/99", "errors"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in summaries:
        errors = s.requests - s.ok
        table.add_row(
            s.label,
            f"{s.throughput:.2f}",
            f"{s.output_tokens_per_s:.0f}",
            _triple(s.itl_ms),
            _triple(s.e2e_ms),
            Text(str(errors), style="red" if errors else ""),
        )
    return table


def notes_lines(summaries: Sequence[PointSummary]) -> list[str]:
    """Every point's findings (errors, workers that failed, client or host bottleneck)."""
    lines = []
    for s in summaries:
        for kind, count in sorted(s.errors.items()):
            example = s.error_examples.get(kind, "")
            lines.append(f"{s.label}: {count} x {kind}: {example}")
        lines += [f"{s.label}: {note}" for note in s.notes]
        if s.cache is not None and s.cache.cached_tokens:
            lines.append(f"{s.label}: {cache_line(s.cache)}")
    return lines


def cache_line(cache: CacheSummary) -> str:
    """Where the prompt tokens came from (answers with SGLang's --enable-cache-report)."""
    text = (
        f"{cache.hit_rate:.0%} of {cache.prompt_tokens} prompt tokens were cached, "
        f"{cache.computed_tokens} computed"
    )
    if cache.storage_tokens is not None:
        text += (
            f" (prefill's own cache {cache.device_tokens}, KV pool {cache.storage_tokens} in "
            f"{cache.pool_hit_requests} requests)"
        )
    return text
