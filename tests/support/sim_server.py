"""An emulated worker in the test's own event loop (aiohttp's TestServer on a free port), for
tests of the sim's HTTP API that need no process of their own (tests/support/sim_launch.py starts
`python -m kit.sim` processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from aiohttp.test_utils import TestServer

from kit.perf.clock import RealClock
from kit.sim.args import parse_args
from kit.sim.engine import Engine
from kit.sim.server import Api
from kit.sim.settings import SimSettings


async def serve(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[Api, TestServer]:
    """A sim worker of Llama-3.1-8B (served as `llama`) with `argv` added, at speed 20 unless
    `env` says otherwise, serving on 127.0.0.1; not ready until the test sets `api.ready`."""
    args = parse_args(
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", *argv]
    )
    settings = SimSettings.from_env({"PDKIT_SIM_SPEED": "20", **(env or {})})
    engine = Engine(args, settings, RealClock(asyncio.get_running_loop(), settings.speed))
    api = Api(engine)
    server = TestServer(api.app(), host="127.0.0.1")
    await server.start_server()
    return api, server
