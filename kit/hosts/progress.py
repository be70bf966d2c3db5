"""How an Ansible run looks in a terminal (rich): a live table per host (task, item, counts) and
a printed line per change or failure. When the output is not a terminal (CI, pipes, tests) the
same information comes as plain lines. `LiveView` is the base of deploy's readiness view too.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kit.hosts.events import RunProgress


def _style(line: str) -> str:
    if line.endswith(("FAILED", "UNREACHABLE")):
        return "bold red"
    if line.startswith("PLAY "):
        return "bold"
    if line.startswith("warning:"):
        return "magenta"
    return "yellow" if line.endswith(": changed") else ""


class LiveView:
    """A rich Live table while the output is a terminal; subclasses say what it shows."""

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


class AnsibleView(LiveView):
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
