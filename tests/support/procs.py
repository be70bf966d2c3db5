"""Whether a process still runs: a zombie counts as gone. A rank or daemon whose parent died is
reparented to PID 1, and not every PID 1 reaps (a container's or a VM's init may not), so
`os.kill(pid, 0)` can keep answering for a process that has long exited."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (Linux's /proc; signal 0 elsewhere)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()  # noqa: SIM115
    except FileNotFoundError:
        return False
    except OSError:
        return True
    # The state follows the command name, which is in parentheses and may itself hold spaces.
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
