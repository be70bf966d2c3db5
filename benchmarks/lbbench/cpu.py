"""CPU accounting from /proc, and pinning processes to CPUs (Linux)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads, and its waited-for children), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def cpu_tree_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (a launcher may exec a child)."""
    total = 0.0
    todo = [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(current)
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
    return total


def pin(cpu: int | None) -> None:
    """Pin this process (and the children it starts from now on) to one CPU; None: leave it."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
