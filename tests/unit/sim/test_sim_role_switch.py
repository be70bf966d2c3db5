"""`POST /pd_role_switch` on the sim, in-process: SGLang 0.5.23's answers and refusals, and a
switched instance serving its new role (server_info, the counters carrying on)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kit.perf.clock import RealClock
from kit.sim.args import parse_args
from kit.sim.engine import Engine
from kit.sim.server import Api
from kit.sim.settings import SimSettings


async def serve(argv: list[str]) -> tuple[Api, TestServer]:
    args = parse_args(
        ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama", *argv]
    )
    settings = SimSettings.from_env({"PDKIT_SIM_SPEED": "20"})
    engine = Engine(args, settings, RealClock(asyncio.get_running_loop(), settings.speed))
    api = Api(engine)
    api.ready = True
    server = TestServer(api.app(), host="127.0.0.1")
    await server.start_server()
    return api, server


PD = ["--disaggregation-transfer-backend", "mooncake_tcp", "--enable-metrics"]


async def switch(server: TestServer, body: object) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.make_url("/pd_role_switch"), json=body) as r,
    ):
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("argv", "body", "message"),
    [
        (
            ["--disaggregation-mode", "decode", *PD],
            {"new_role": "prefill"},
            "--enable-pd-role-switch is not set on this server",
        ),
        (
            ["--disaggregation-mode", "decode", *PD, "--enable-pd-role-switch"],
            {"new_role": "colocated"},
            "invalid new_role='colocated'",
        ),
        (
            ["--enable-pd-role-switch"],
            {"new_role": "prefill"},
            "instance is not running in PD disaggregation mode",
        ),
        (
            [
                "--disaggregation-mode",
                "decode",
                "--disaggregation-transfer-backend",
                "fake",
                "--enable-pd-role-switch",
            ],
            {"new_role": "prefill"},
            "transfer backend 'fake' does not support runtime role switch",
        ),
        (
            ["--disaggregation-mode", "prefill", *PD, "--enable-pd-role-switch"],
            {"new_role": "decode"},
            "decode_cuda_graph_memory_gb is required before capturing decode graphs",
        ),
        (
            ["--disaggregation-mode", "prefill", *PD, "--enable-pd-role-switch"],
            {"new_role": "decode", "decode_cuda_graph_memory_gb": -1},
            "decode_cuda_graph_memory_gb must be non-negative",
        ),
    ],
)
def test_refusals_say_what_sglang_says(argv, body, message):
    async def main() -> None:
        api, server = await serve(argv)
        try:
            status, answer = await switch(server, body)
            assert status == 400
            assert answer["success"] is False
            assert answer["message"] == message
            assert answer["safe_to_restore"] is True
            assert api.engine.mode.value == (
                argv[1] if argv[0] == "--disaggregation-mode" else "null"
            )
        finally:
            await server.close()
            await api.engine.close()

    asyncio.run(main())


def test_a_busy_instance_is_refused_then_an_idle_one_switches_and_back():
    async def main() -> None:
        api, server = await serve(
            ["--disaggregation-mode", "decode", *PD, "--enable-pd-role-switch"]
        )
        try:
            api.engine.pd.bootstrap_queue = 1  # a request waits: not idle
            status, answer = await switch(server, {"new_role": "prefill"})
            assert (status, answer["message"]) == (
                400,
                "instance is not idle; drain all requests before switching",
            )
            api.engine.pd.bootstrap_queue = 0
            status, answer = await switch(server, {"new_role": "prefill"})
            assert (status, answer) == (
                200,
                {
                    "success": True,
                    "message": "ok",
                    "old_role": "decode",
                    "new_role": "prefill",
                    "safe_to_restore": False,
                },
            )
            assert api.engine.mode.value == "prefill"
            async with (
                aiohttp.ClientSession() as http,
                http.get(server.make_url("/server_info")) as r,
            ):
                info = await r.json()
            assert info["disaggregation_mode"] == "prefill"
            graphs = {
                k: info["internal_states"][0][k]
                for k in ("decode_cuda_graph_bs", "decode_cuda_graph_memory_gb")
            }
            status, answer = await switch(server, {"new_role": "prefill"})
            assert (status, answer["message"]) == (200, "already in target role")
            status, answer = await switch(server, {"new_role": "decode", **graphs})
            assert (status, answer["success"], answer["old_role"]) == (200, True, "prefill")
            assert api.engine.mode.value == "decode"
        finally:
            await server.close()
            await api.engine.close()

    asyncio.run(main())
