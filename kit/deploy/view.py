"""How deploy progress looks in a terminal (rich): a live table per host while Ansible runs,
one line per process while pdkit waits for readiness, the final status table. When the output
is not a terminal (CI, pipes, tests) the same information comes as plain lines, one per change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kit.deploy.events import RunProgress
from kit.deploy.wait import ProcessStatus

STATE_STYLE = {
    "ready": "green",
    "starting": "yellow",
    "waiting": "dim",
    "failed": "bold red",
    "timeout": "bold red",
}


def _style(line: str) -> str:
    if line.endswith(("FAILED", "UNREACHABLE")):
        return "bold red"
    if line.startswith("PLAY "):
        return "bold"
    if line.startswith("warning:"):
        return "magenta"
    return "yellow" if line.endswith(": changed") else ""


class _LiveView:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None

    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self.live = Live(
                self._table(), console=self.console, refresh_per_second=8, transient=True
            )
            self.live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.live is not None:
            self.live.__exit__(exc_type, exc, tb)
            self.live = None

    def _table(self) -> Table:
        return Table()

    def _print(self, text: str, style: str = "") -> None:
        self.console.print(Text("  " + text, style=style))

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._table())


class AnsibleView(_LiveView):
    """Live per-host table (task, item, counts) plus a printed line per change or failure."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.progress = RunProgress()

    def listener(self, progress: RunProgress, lines: list[str], event: Mapping[str, Any]) -> None:
        self.progress = progress
        for line in lines:
            for part in line.splitlines():
                self._print(part, _style(line))
        self._refresh()

    def _table(self) -> Table:
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for column in ("host", "task", "item", "ok", "changed", "failed"):
            table.add_column(
                column, justify="right" if column in ("ok", "changed", "failed") else "left"
            )
        for name, host in sorted(self.progress.hosts.items()):
            table.add_row(
                name,
                host.task,
                host.item or "",
                str(host.ok),
                Text(str(host.changed), style="yellow" if host.changed else ""),
                Text(str(host.failed), style="red" if host.failed else ""),
            )
        return table


class ReadinessView(_LiveView):
    """One line per process with its state, elapsed time and detail (live on a terminal; a
    printed line per state change otherwise)."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.statuses: list[ProcessStatus] = []
        self._shown: dict[str, str] = {}

    def update(self, statuses: list[ProcessStatus]) -> None:
        self.statuses = statuses
        if self.live is not None:
            self._refresh()
            return
        for status in statuses:
            if self._shown.get(status.target.name) != status.verdict.state:
                self._shown[status.target.name] = status.verdict.state
                self._print(_status_line(status), STATE_STYLE.get(status.verdict.state, ""))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        live = self.live is not None
        super().__exit__(exc_type, exc, tb)
        if live:  # the transient table is gone: leave the final lines
            for status in self.statuses:
                self._print(_status_line(status), STATE_STYLE.get(status.verdict.state, ""))

    def _table(self) -> Table:
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        for column in ("process", "host", "state", "elapsed", "detail"):
            table.add_column(column, justify="right" if column == "elapsed" else "left")
        for s in self.statuses:
            table.add_row(
                s.target.name,
                s.target.host,
                Text(s.verdict.state, style=STATE_STYLE.get(s.verdict.state, "")),
                f"{s.elapsed:.1f}s",
                s.verdict.detail,
            )
        return table


def _status_line(status: ProcessStatus) -> str:
    t = status.target
    return (
        f"{t.name:<14} {t.host:<12} {status.verdict.state:<9} {status.elapsed:6.1f}s  "
        f"{status.verdict.detail}"
    )


def status_table(rows: Sequence[Sequence[str]]) -> Table:
    """The final table: process, role, host, endpoint, state, pid."""
    table = Table(box=None, header_style="dim", pad_edge=False)
    for column in ("process", "role", "host", "endpoint", "state", "pid"):
        table.add_column(column)
    for row in rows:
        state = row[4]
        table.add_row(*row[:4], Text(state, style=STATE_STYLE.get(state, "")), *row[5:])
    return table
