"""How deploy progress looks in a terminal (rich): one line per process while pdkit waits for
readiness, the final status table (the live table per host while Ansible runs is
`kit.hosts.progress`'s). When the output is not a terminal (CI, pipes, tests) the same
information comes as plain lines, one per change.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kit.deploy.wait import ProcessStatus
from kit.hosts.progress import LiveView

STATE_STYLE = {
    "ready": "green",
    "starting": "yellow",
    "waiting": "dim",
    "failed": "bold red",
    "timeout": "bold red",
}


class ReadinessView(LiveView):
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
