"""Free TCP ports on 127.0.0.1 for the servers tests and benchmarks start: the one helper.

The suite runs in several pytest-xdist workers at once. Each worker hands out ports from a
range of its own below the kernel's ephemeral ports (32768 and up: what `bind(0)` and every
outgoing connection get), so that neither another worker nor a client socket can take a port
between the moment a test picks it and the moment its server binds it. Within a worker the
ports go round the range, each checked free when handed out. Outside xdist: the first range.

Every port is handed out with the BLOCK - 1 ports after it, free too and given to nobody else:
a topology's role takes its base port plus the instance index, a DP worker its port plus the
rank.

Only the standard library (benchmarks use it too).
"""

from __future__ import annotations

import os
import random
import socket

FIRST_PORT = 20000
WORKER_SPAN = 2000
"""Worker gwN hands out ports FIRST_PORT + N * WORKER_SPAN up to the next worker's first; six
workers fit below 32768."""
MAX_WORKERS = 6
BLOCK = 8


class _WorkerPorts:
    """This process's range (from its xdist worker's name) and its place in it."""

    def __init__(self) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ...
        index = int(worker[2:]) % MAX_WORKERS if worker[2:].isdigit() else 0
        first = FIRST_PORT + index * WORKER_SPAN
        self.range = range(first, first + WORKER_SPAN)
        self.next = random.randrange(WORKER_SPAN)  # another session on this machine: elsewhere

    def block(self, count: int, host: str) -> int:
        for _ in range(WORKER_SPAN):
            if self.next + count > WORKER_SPAN:
                self.next = 0
            first = self.range[self.next]
            self.next += count
            if all(_bindable(port, host) for port in range(first, first + count)):
                return first
        raise RuntimeError(f"no {count} consecutive free ports in {self.range}")


_PORTS = _WorkerPorts()


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports (at least BLOCK), all free on `host` right now,
    from this worker's range; none handed out since the range last went round."""
    return _PORTS.block(max(count, BLOCK), host)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now, from this worker's range (with BLOCK - 1 after it)."""
    return free_block(1, host)


def free_ports(count: int) -> list[int]:
    """`count` ports, each with BLOCK - 1 free ports after it, no two blocks overlapping."""
    return [free_block(1) for _ in range(count)]
