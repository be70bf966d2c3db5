"""Process logs: the last lines of a log file, and following several logs at once.

Every process logs to ``<root>/var/log/pdkit/<name>/<process>.log`` on its host (supervisord
writes it; on systemd hosts the launch script tees into it and the journal keeps a copy).
`pdkit down` keeps the logs. Logs of local hosts are read directly; remote hosts are read with
``ssh <host> tail`` using the topology's SSH settings.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.errors import DeployError
from kit.hosts.inventory import DeployHost

FOLLOW_INTERVAL_S = 0.25
_CHUNK = 8192


@dataclass(frozen=True)
class LogFile:
    """One process's log on its host: `path` is the Plan's `log_path` of the process."""

    process: str
    host: DeployHost
    path: str


def tail_lines(path: str, count: int) -> list[str]:
    """The last `count` lines of a local file ([] when it does not exist); reads from the end,
    so a large log costs no more than its tail."""
    if count <= 0:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            position = handle.tell()
            data = b""
            while position > 0 and data.count(b"\n") <= count:
                step = min(_CHUNK, position)
                position -= step
                handle.seek(position)
                data = handle.read(step) + data
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise DeployError(f"cannot read the log {path} ({exc.strerror}).") from exc
    lines = data.decode(errors="replace").splitlines()
    return lines[-count:]


def ssh_argv(host: DeployHost, remote: Sequence[str]) -> list[str]:
    """``ssh`` argv that runs `remote` on a host with its topology SSH settings (sudo -n when
    the deployment needs become there), and the options Ansible gets in ANSIBLE_SSH_ARGS (a
    known_hosts file, say), so that pdkit reaches hosts the way its playbooks do."""
    plan = host.plan
    argv = ["ssh", *shlex.split(os.environ.get("ANSIBLE_SSH_ARGS", ""))]
    argv += ["-o", "BatchMode=yes", "-p", str(plan.ssh_port)]
    if plan.ssh_key:
        argv += ["-i", plan.ssh_key]
    command = [*(["sudo", "-n"] if host.become else []), *remote]
    return [*argv, f"{plan.ssh_user}@{plan.address}", shlex.join(command)]


def tail(log: LogFile, count: int) -> list[str]:
    """The last `count` lines of a process's log, wherever its host is."""
    if log.host.local:
        return tail_lines(log.path, count)
    argv = ssh_argv(log.host, ["tail", "-n", str(count), log.path])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeployError(f"cannot read {log.path} on {log.host.name} over SSH: {exc}.") from exc
    if done.returncode != 0:
        raise DeployError(
            f"cannot read {log.path} on {log.host.name} over SSH: {done.stderr.strip()}"
        )
    return done.stdout.splitlines()


def matching_lines(log: LogFile, needles: Sequence[str]) -> list[str]:
    """Every line of a process's log (its current file) that contains one of `needles`, in
    file order, wherever its host is (`grep -F` over SSH)."""
    wanted = [n for n in needles if n]
    if not wanted:
        return []
    if not log.host.local:
        patterns = [arg for needle in wanted for arg in ("-e", needle)]
        argv = ssh_argv(log.host, ["grep", "-F", "-h", *patterns, "--", log.path])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeployError(f"cannot search {log.path} on {log.host.name}: {exc}.") from exc
        if done.returncode > 1:  # 1: no line matched
            raise DeployError(
                f"cannot search {log.path} on {log.host.name} over SSH: {done.stderr.strip()}"
            )
        return done.stdout.splitlines()
    try:
        with open(log.path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise DeployError(f"cannot read the log {log.path} ({exc.strerror}).") from exc
    starts: set[int] = set()
    for needle in wanted:
        target = needle.encode()
        at = data.find(target)
        while at >= 0:
            start = data.rfind(b"\n", 0, at) + 1
            starts.add(start)
            end = data.find(b"\n", at)
            at = data.find(target, end if end >= 0 else len(data))
    lines = []
    for start in sorted(starts):
        end = data.find(b"\n", start)
        lines.append(data[start : end if end >= 0 else len(data)].decode(errors="replace"))
    return lines


def follow(
    logs: Sequence[LogFile],
    emit: Callable[[str, str], None],
    stop: Callable[[], bool] = lambda: False,
    interval: float = FOLLOW_INTERVAL_S,
) -> None:
    """Print new lines of local logs as they come (`emit(process, line)`) until `stop()`;
    survives rotation (a new file at the path is read from its start)."""
    remote = [log for log in logs if not log.host.local]
    if remote:
        raise DeployError(
            f"`pdkit logs -f` follows local logs only; {remote[0].process} runs on "
            f"{remote[0].host.name}. To fix: `ssh` there and `tail -F {remote[0].path}`."
        )
    offsets: dict[str, tuple[int, int]] = {}
    for log in logs:
        try:
            info = os.stat(log.path)
            offsets[log.path] = (info.st_ino, info.st_size)
        except FileNotFoundError:
            offsets[log.path] = (0, 0)
    pending: dict[str, bytes] = {}
    while not stop():
        for log in logs:
            _read_new(log, offsets, pending, emit)
        time.sleep(interval)


def _read_new(
    log: LogFile,
    offsets: dict[str, tuple[int, int]],
    pending: dict[str, bytes],
    emit: Callable[[str, str], None],
) -> None:
    inode, offset = offsets[log.path]
    try:
        info = os.stat(log.path)
    except FileNotFoundError:
        return
    if info.st_ino != inode or info.st_size < offset:  # rotated or truncated
        inode, offset = info.st_ino, 0
    if info.st_size == offset:
        offsets[log.path] = (inode, offset)
        return
    with open(log.path, "rb") as handle:
        handle.seek(offset)
        data = pending.pop(log.path, b"") + handle.read(info.st_size - offset)
    offsets[log.path] = (inode, info.st_size)
    *complete, rest = data.split(b"\n")
    if rest:
        pending[log.path] = rest
    for line in complete:
        emit(log.process, line.decode(errors="replace"))


def show_logs(
    logs: Sequence[LogFile],
    write: Callable[[str], None],
    note: Callable[[str], None],
    lines: int,
    follow_new: bool = False,
) -> None:
    """Write the last `lines` lines of each log (prefixed by the process name when there are
    several), then with `follow_new` keep writing new lines until interrupted."""
    width = max((len(log.process) for log in logs), default=0)

    def line_out(process: str, line: str) -> None:
        write(f"{process:<{width}} | {line}" if len(logs) > 1 else line)

    for log in logs:
        got = tail(log, lines)
        if not got and log.host.local and not os.path.exists(log.path):
            note(f"{log.process}: no log yet at {log.path} (never started on {log.host.name}?)")
        for line in got:
            line_out(log.process, line)
    if follow_new:
        follow(logs, line_out)
