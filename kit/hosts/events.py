"""Ansible's event stream (as ansible-runner delivers it) -> what pdkit shows: per host the
task it runs and its counts, per process what changed, and for a failure the host, the task,
the item and what the module said on stderr. Pure: `RunProgress.feed` takes one event dict and
returns the lines worth printing; the rich view lives in `kit.hosts.progress`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_OUTPUT_LINES = 15
"""Lines of a failed task's stderr/stdout kept in the report (the full text is in artifacts)."""

_HINTS: tuple[tuple[str, str], ...] = (
    (
        "No module named supervisor",
        "the host's pdkit_python has no supervisor package: install it into that environment "
        "(`<pdkit_python> -m pip install supervisor`, or `pip install -e '.[test]'` for the "
        "local default).",
    ),
    (
        "Permission denied",
        "the connecting user cannot write the root prefix: choose a root it owns, or connect "
        "as a user that may sudo (ansible_become).",
    ),
    (
        "UNREACHABLE",
        "Ansible cannot reach the host: check hosts[].address and ssh settings, and that "
        "`ssh user@address` works without a password prompt.",
    ),
)


@dataclass(frozen=True)
class TaskFailure:
    """One failed task on one host (one loop item when the task loops)."""

    host: str
    task: str
    item: str | None
    message: str
    stderr: str
    stdout: str
    unreachable: bool = False

    def describe(self) -> str:
        """A paragraph naming host, task and item, with the module's message and output."""
        what = f"task '{self.task}'" + (f" for {self.item}" if self.item else "")
        head = (
            f"host {self.host}: unreachable during {what}"
            if self.unreachable
            else f"host {self.host}: {what} failed"
        )
        lines = [f"{head}: {self.message}" if self.message else head]
        for label, text in (("stderr", self.stderr), ("stdout", self.stdout)):
            if text.strip():
                tail = text.rstrip().splitlines()[-MAX_OUTPUT_LINES:]
                lines.append(f"  {label}:")
                lines += [f"    {line}" for line in tail]
        hint = self.hint()
        if hint:
            lines.append(f"  To fix: {hint}")
        return "\n".join(lines)

    def line(self) -> str:
        """One progress line; `describe()` has the details."""
        state = "UNREACHABLE" if self.unreachable else "FAILED"
        return f"{self.host}: {self.item + ': ' if self.item else ''}{self.task}: {state}"

    def hint(self) -> str | None:
        text = " ".join((self.message, self.stderr, self.stdout))
        if self.unreachable:
            return _HINTS[2][1]
        for pattern, hint in _HINTS:
            if pattern in text:
                return hint
        return None


@dataclass
class HostProgress:
    """Counters and the current task of one host."""

    task: str = ""
    item: str | None = None
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False


@dataclass(frozen=True)
class Change:
    """A task that changed something on a host, for one process (loop item) or for the host."""

    host: str
    task: str
    item: str | None


@dataclass
class RunProgress:
    """State of one playbook run, updated event by event."""

    play: str = ""
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    failures: list[TaskFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    finished: bool = False
    _changed_items: dict[tuple[str, str], list[str]] = field(default_factory=dict, repr=False)

    def host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress())

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def feed(self, event: Mapping[str, Any]) -> list[str]:
        """Account for one ansible-runner event; return the lines a user should see for it."""
        kind = str(event.get("event", ""))
        data: Mapping[str, Any] = event.get("event_data") or {}
        host = str(data.get("host", ""))
        task = _clean(str(data.get("task", "")))
        res = data.get("res")
        res = res if isinstance(res, Mapping) else {}
        lines: list[str] = []
        if kind == "playbook_on_play_start":
            self.play = _clean(str(data.get("name") or data.get("play", "")))
        elif kind == "runner_on_start":
            progress = self.host(host)
            progress.task, progress.item = task, None
        elif kind in ("runner_item_on_ok", "runner_item_on_failed", "runner_item_on_skipped"):
            item = _item_label(res)
            self.host(host).item = item
            if kind == "runner_item_on_ok" and res.get("changed"):
                self.changes.append(Change(host, task, item))
                self._changed_items.setdefault((host, task), []).append(item or "-")
            elif kind == "runner_item_on_failed":
                lines.append(self._fail(host, task, item, res).line())
        elif kind == "runner_on_ok":
            progress = self.host(host)
            progress.ok += 1
            items = self._changed_items.pop((host, task), [])
            items += [str(p) for p in res.get("changed_processes") or ()]  # pdkit_files
            if res.get("changed"):
                progress.changed += 1
                if "results" not in res:  # a loop's items were recorded one by one
                    self.changes.append(Change(host, task, None))
                lines.append(
                    f"{host}: {task}: changed" + (f" ({', '.join(items)})" if items else "")
                )
            lines += self._warnings(host, res)
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                self.host(host).ok += 1
            else:
                self.host(host).failed += 1
                if not any(f.host == host and f.task == task for f in self.failures):
                    lines.append(self._fail(host, task, None, res).line())
        elif kind == "runner_on_skipped":
            self.host(host).skipped += 1
        elif kind == "runner_on_unreachable":
            progress = self.host(host)
            progress.unreachable, progress.failed = True, progress.failed + 1
            failure = TaskFailure(host, task, None, _message(res), "", "", unreachable=True)
            self.failures.append(failure)
            lines.append(failure.line())
        elif kind == "warning":
            text = _clean(str(data.get("warning", "")))
            if text:
                self.warnings.append(text)
                lines.append(f"warning: {text}")
        elif kind == "playbook_on_stats":
            self.finished = True
            for progress in self.hosts.values():
                progress.task, progress.item = "done", None
        return lines

    def _fail(self, host: str, task: str, item: str | None, res: Mapping[str, Any]) -> TaskFailure:
        failure = TaskFailure(
            host=host,
            task=task,
            item=item,
            message=_message(res),
            stderr=str(res.get("stderr") or res.get("module_stderr") or ""),
            stdout=str(res.get("stdout") or res.get("module_stdout") or ""),
        )
        self.failures.append(failure)
        return failure

    def _warnings(self, host: str, res: Mapping[str, Any]) -> list[str]:
        out = []
        for warning in res.get("warnings") or ():
            text = f"{host}: {_clean(str(warning))}"
            self.warnings.append(text)
            out.append(f"warning: {text}")
        return out

    def summary(self) -> str:
        """One line per host: ok/changed/failed counts."""
        parts = []
        for name, p in sorted(self.hosts.items()):
            state = "unreachable" if p.unreachable else f"ok={p.ok} changed={p.changed}"
            if p.failed and not p.unreachable:
                state += f" failed={p.failed}"
            parts.append(f"{name}: {state}")
        return "; ".join(parts) or "no host matched"


def _item_label(res: Mapping[str, Any]) -> str | None:
    label = res.get("_ansible_item_label", res.get("item"))
    if label is None:
        return None
    if isinstance(label, Mapping):
        return str(label.get("name") or label.get("path") or "item")
    return str(label)


def _message(res: Mapping[str, Any]) -> str:
    if res.get("censored"):
        return str(res["censored"])
    message = str(res.get("msg") or res.get("reason") or "").strip()
    if not message and "rc" in res:
        message = f"exit status {res['rc']}"
    return _clean(message)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _clean(text: str) -> str:
    return _ANSI.sub("", text).strip()
