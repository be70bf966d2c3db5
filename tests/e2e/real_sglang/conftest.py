"""Fixtures of the real engine's tests: one tiny model and the plain (colocated) real servers for
the whole session, since each real server takes 30-110 s to start on this machine (about 30 s
of CPU, the rest waiting).

A server is launched when first asked for and not waited for until a test needs its answers:
`test_real_sglang.py` launches the plain one with its pair, so that the starts overlap. A test
may kill one (the router tokenizer's out-of-vocabulary test does, on purpose): the next test
that asks for it gets a new one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.real_sglang import RealServer, tiny_model

SERVER_FLAGS = {
    "plain": [],
    # The wire fidelity's: a request with no output bound (max_tokens null) ends within seconds
    # (the tiny model never ends on its own); the corpus's default-server cases are short.
    "wire": ["--enable-metrics", "--context-length", "128"],
}
"""The session's plain servers by name, and their flags past kit's CPU profile."""


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (seed 0) every real server of the session serves."""
    return tiny_model(tmp_path_factory.mktemp("real-model") / "tiny-llama")


class RealServers:
    """The session's plain servers (SERVER_FLAGS), each launched by `get()`, again when the last
    one died."""

    def __init__(self, model: Path, log_dir: Path) -> None:
        self.model, self.log_dir = model, log_dir
        self.running: dict[str, RealServer] = {}

    def get(self, name: str) -> RealServer:
        """The server `name`, running or starting: call its `wait_ready()` before requests."""
        server = self.running.get(name)
        if server is not None and server.alive():
            return server
        if server is not None:
            server.stop()
        self.running[name] = RealServer(self.model, self.log_dir, SERVER_FLAGS[name]).launch()
        return self.running[name]

    def stop(self) -> None:
        for server in self.running.values():
            server.stop()


@pytest.fixture(scope="session")
def real_servers(
    real_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealServers]:
    servers = RealServers(real_model, tmp_path_factory.mktemp("plain-servers"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def colocated(real_servers: RealServers) -> RealServer:
    """The plain real server of the tiny model (`real_model`), ready."""
    server = real_servers.get("plain")
    server.wait_ready()
    return server
