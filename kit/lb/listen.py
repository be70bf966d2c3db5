"""The router's listening sockets, and how a handover carries them to a new image.

1. One process (`--processes 1`) listens on one socket; a group (`kit.lb.processes`) on N
   sockets bound to the same port with SO_REUSEPORT (the kernel spreads connections over
   them), created by the supervisor before it forks, child i serving socket i.
2. A handover (SIGUSR2) keeps every socket open across an exec of the launch script: their
   descriptors go in $PDKIT_LB_LISTEN_FD (comma-separated), so the kernel keeps queueing
   connections on them and the new image accepts those. The sockets are never closed, so a
   connection that reached one is never reset.
3. The new image serves every socket it inherits (`assign`): one process serves them all, a
   group spreads them over its children (more children than sockets: a socket bound with
   SO_REUSEPORT gets siblings on the same port; one bound without is shared by several).
"""

from __future__ import annotations

import logging
import os
import socket
import sys

from kit.lb.config import LbConfig
from kit.lb.errors import LbError

log = logging.getLogger("kit.lb")
LISTEN_FD_ENV = "PDKIT_LB_LISTEN_FD"
"""The listening sockets' descriptors (comma-separated), inherited through a handover."""
RELAUNCH_ENV = "PDKIT_LB_RELAUNCH"
"""What a handover execs: the launch script (pdkit's deployments set it), else this command."""


def inherited() -> list[socket.socket]:
    """The sockets a handover passed on ($PDKIT_LB_LISTEN_FD, then unset), not inheritable."""
    fds = [int(fd) for fd in os.environ.pop(LISTEN_FD_ENV, "").split(",") if fd.isdigit()]
    out = []
    for fd in fds:
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(False)
        out.append(sock)
    return out


def bind(config: LbConfig, *, reuse_port: bool) -> socket.socket:
    """A new listening socket on --host/--port; `LbError` when it cannot listen."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    try:
        return socket.create_server(
            (config.host, config.port), family=family, backlog=4096, reuse_port=reuse_port
        )
    except OSError as exc:
        raise LbError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror}. "
            "To fix: pick a free --port or stop what holds it."
        ) from exc


def listeners(config: LbConfig, n: int) -> list[socket.socket]:
    """The sockets `n` processes serve: those inherited through a handover, topped up to `n`
    with siblings on the same port where they were bound with SO_REUSEPORT; without any, one
    new socket (`n` 1) or `n` new ones with SO_REUSEPORT."""
    socks = inherited()
    if not socks:
        if n == 1:
            return [bind(config, reuse_port=False)]
        socks = [bind(config, reuse_port=True)]
    if socks[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        socks += [bind(config, reuse_port=True) for _ in range(n - len(socks))]
    return socks


def assign(socks: list[socket.socket], n: int, index: int) -> list[socket.socket]:
    """The sockets process `index` of `n` serves: every n-th from `index` on, or one shared
    socket where there are fewer sockets than processes."""
    if len(socks) < n:
        return [socks[index % len(socks)]]
    return socks[index::n]


def relaunch(socks: list[socket.socket], env: dict[str, str] | None = None) -> None:
    """Exec the launch script (or this command line) with `socks` passed on, and `env` added
    to the environment. Does not return."""
    for sock in socks:
        sock.set_inheritable(True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fds = ",".join(str(s.fileno()) for s in socks)
    full = {**os.environ, **(env or {}), LISTEN_FD_ENV: fds}
    script = os.environ.get(RELAUNCH_ENV, "")
    argv = [script] if script else [sys.executable, "-m", "kit.lb", *sys.argv[1:]]
    log.info("handing the socket over: exec %s", argv[0])
    logging.shutdown()
    os.execve(argv[0], argv, full)
