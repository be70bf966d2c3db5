"""pdkit's load balancer in front of real emulated workers (`python -m kit.sim`, PD over Mooncake).

The sim workers are separate processes doing the real PD handshake (bootstrap server, KV moved
over the transfer engine), so a request only completes if the load balancer sent both legs the
right bootstrap fields.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
from aiohttp import web

from kit.lb.config import parse_args
from kit.lb.server import LoadBalancer
from tests.support.lb_cluster import FAST_HEALTH, run
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, worker_argv

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "20", "PDKIT_SIM_GPU": "H100-SXM"}


def test_openai_client_streams_through_pdkit_lb_in_front_of_sim_workers():
    async def scenario():
        boot = free_port()
        sims = [
            SimProcess(
                worker_argv(
                    port=free_port(),
                    mode="prefill",
                    bootstrap_port=boot,
                    model=MODEL,
                    served_name=MODEL,
                ),
                env=SIM_ENV,
            ).start(),
            SimProcess(
                worker_argv(
                    port=free_port(),
                    mode="decode",
                    model=MODEL,
                    served_name=MODEL,
                    extra=["--base-gpu-id", "1"],
                ),
                env=SIM_ENV,
            ).start(),
        ]
        runner = None
        try:
            config = parse_args(
                [
                    "--prefill",
                    sims[0].url,
                    str(boot),
                    "--decode",
                    sims[1].url,
                    *FAST_HEALTH,
                ],
                {"PDKIT_LB_API_KEY": "sk-sim"},
            )
            lb = LoadBalancer(config)
            await lb.start()
            runner = web.ServerRunner(lb.make_server())
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            deadline = time.monotonic() + 60
            while not lb.readiness_report()[0]:
                assert time.monotonic() < deadline, lb.readiness_report()[1]
                for sim in sims:
                    assert sim.proc is not None and sim.proc.poll() is None, sim.log()[-3000:]
                await asyncio.sleep(0.1)
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-sim", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Say hello."}],
                    max_tokens=8,
                    stream=True,
                )
                pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
                assert "".join(pieces).strip()
                reply = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Again."}], max_tokens=4
                )
                assert reply.usage.completion_tokens == 4
            finally:
                await client.close()
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-sim"}) as session:
                async with session.post(
                    url + "/generate",
                    json={
                        "text": ["one two three", "four five"],
                        "return_logprob": True,
                        "logprob_start_len": 0,
                        "sampling_params": {"max_new_tokens": 3},
                    },
                ) as resp:
                    assert resp.status == 200
                    items = await resp.json()
                for item in items:
                    meta = item["meta_info"]
                    assert len(meta["output_token_logprobs"]) == 3
                    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
        finally:
            if runner is not None:
                await runner.cleanup()
                await lb.close()
            for sim in sims:
                sim.stop()

    run(scenario(), timeout=120)
