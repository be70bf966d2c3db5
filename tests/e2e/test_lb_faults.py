"""Worker faults behind pdkit's load balancer with real emulated workers (`python -m kit.sim`):
a decode killed mid-stream (`/generate` ids, and chat streams from the openai client), and the
only decode restarting, cost no request."""

from __future__ import annotations

import asyncio
import json
import signal
from contextlib import ExitStack

import aiohttp
import openai
from aiohttp import web

from kit.lb.config import parse_args
from kit.lb.server import LoadBalancer
from kit.perf.models import resolve_model
from tests.support.lb_cluster import FAST_HEALTH, run
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, worker_argv

SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_GPU": "H100-SXM"}
# Streams that a kill must cut: no EOS, so each runs its whole budget (300 tokens, about 2 s of
# the emulated H100) and a kill at its first event always finds most of it still to come.
UNENDING = {**SIM_ENV, "PDKIT_SIM_ANSWER_TOKENS": "0"}
STREAM_TOKENS = 300


def _sims(
    stack: ExitStack, decodes: int, env: dict[str, str] = SIM_ENV
) -> tuple[SimProcess, int, list[SimProcess]]:
    boot = free_port()
    prefill = SimProcess(
        worker_argv(port=free_port(), mode="prefill", bootstrap_port=boot), env=env
    )
    decode = [
        SimProcess(
            worker_argv(port=free_port(), mode="decode", extra=["--base-gpu-id", str(1 + i)]),
            env=env,
        )
        for i in range(decodes)
    ]
    for sim in (prefill, *decode):
        stack.enter_context(sim)
    for sim in (prefill, *decode):
        sim.wait_ready()
    return prefill, boot, decode


async def _router(prefill: SimProcess, boot: int, decode: list[SimProcess], *extra: str):
    argv = ["--prefill", prefill.url, str(boot)]
    for sim in decode:
        argv += ["--decode", sim.url]
    argv += ["--host", "127.0.0.1", "--port", "1", *FAST_HEALTH, *extra]
    lb = LoadBalancer(parse_args(argv, {}))
    await lb.start()
    runner = web.ServerRunner(lb.make_server())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    for _ in range(200):
        if lb.readiness_report()[0] and all(w.routable for w in lb.pool):
            break
        await asyncio.sleep(0.05)
    return lb, runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class KillAtFirstEvent:
    """Kills `victim` (SIGKILL) as soon as a stream it serves has relayed its first event, so
    that the kill cuts streams in flight on it, however slowly the machine runs: a kill at a
    fixed time may come after every stream on it ended, or before any reached it."""

    def __init__(self, victim: SimProcess) -> None:
        self.victim = victim
        self.killed = asyncio.Event()

    def first_event(self, decode_url: str | None) -> None:
        """A stream served by `decode_url` (the router's X-PDKit-Decode) relayed its first
        event."""
        if decode_url == self.victim.url and not self.killed.is_set():
            self.victim.kill(signal.SIGKILL)
            self.killed.set()

    async def wait(self, timeout: float = 30) -> None:
        try:
            await asyncio.wait_for(self.killed.wait(), timeout)
        except TimeoutError:
            victim = self.victim.url
            raise AssertionError(f"no stream reached {victim} within {timeout} s") from None


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    seq: int,
    tokens: int,
    kill: KillAtFirstEvent | None = None,
) -> dict:
    body = {
        "input_ids": [100 + seq, 200, 300, 400],
        "stream": True,
        "sampling_params": {"max_new_tokens": tokens},
    }
    async with session.post(url + "/generate", json=body) as r:
        raw = await r.content.readline()  # the first event's line
        if kill is not None:
            kill.first_event(r.headers.get("X-PDKit-Decode"))
        raw += await r.read()
    events = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
    assert r.status == 200, raw[:300]
    assert events[-1] == b"[DONE]", raw[-300:]
    last = json.loads(events[-2])
    assert "error" not in last, last
    return last


def test_a_decode_killed_mid_stream_costs_no_request():
    async def scenario(prefill, boot, decode):
        lb, runner, url = await _router(prefill, boot, decode)
        try:
            kill = KillAtFirstEvent(decode[0])
            async with aiohttp.ClientSession() as session:
                streams = [
                    asyncio.create_task(_stream(session, url, i, STREAM_TOKENS, kill))
                    for i in range(8)
                ]
                await kill.wait()
                finished = await asyncio.gather(*streams)
            for last in finished:
                # one stream: every id sent, usage as for the original prompt
                meta = last["meta_info"]
                assert len(last["output_ids"]) == meta["completion_tokens"] == STREAM_TOKENS
                assert meta["prompt_tokens"] == 4 and meta["finish_reason"] is not None
            assert lb.metrics.migrations.get("died", 0) >= 1
        finally:
            await runner.cleanup()
            await lb.close()

    with ExitStack() as stack:
        run(scenario(*_sims(stack, 2, UNENDING)), timeout=60)


def test_the_only_decode_restarting_within_the_hold_costs_no_request():
    async def scenario(prefill, boot, decode):
        lb, runner, url = await _router(prefill, boot, decode, "--hold-timeout", "10")
        try:
            async with aiohttp.ClientSession() as session:
                decode[0].kill(signal.SIGKILL)
                decode[0].proc.wait(5)
                requests = [asyncio.create_task(_stream(session, url, i, 8)) for i in range(4)]
                await asyncio.sleep(1.0)
                decode[0].start()  # as supervisord restarts it
                await asyncio.gather(*requests)
            assert lb.metrics.holds.get("decode", 0) >= 1
        finally:
            await runner.cleanup()
            await lb.close()

    with ExitStack() as stack:
        run(scenario(*_sims(stack, 1)), timeout=60)


def test_a_decode_killed_under_chat_streams_costs_no_stream():
    """Chat streams from the openai client: the router bridges their legs through
    /v1/completions with its own prompt ids (the sim's chat rendering, `--prompt-tokens sim`),
    so a stream cut by a killed decode is continued on the other decode."""
    vocab = resolve_model("meta-llama/Llama-3.1-8B-Instruct").vocab

    async def chat(
        client: openai.AsyncOpenAI, seq: int, kill: KillAtFirstEvent | None = None
    ) -> tuple[str, int, object]:
        response = await client.chat.completions.with_raw_response.create(
            model="llama",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"Tell me story number {seq}."},
            ],
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        stream = response.parse()
        text, finish, usage, first = "", None, None, True
        async for chunk in stream:
            if kill is not None and first:
                kill.first_event(response.headers.get("X-PDKit-Decode"))
            first = False
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert finish is not None and usage is not None
        return text, seq, usage

    async def scenario(prefill, boot, decode):
        lb, runner, url = await _router(prefill, boot, decode, "--prompt-tokens", f"sim:{vocab}")
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        try:
            whole = await chat(client, 99)  # one unbroken stream: its prompt count
            kill = KillAtFirstEvent(decode[0])
            streams = [asyncio.create_task(chat(client, i, kill)) for i in range(8)]
            await kill.wait()
            finished = await asyncio.gather(*streams)
            for text, _, usage in finished:
                assert text and usage.prompt_tokens == whole[2].prompt_tokens
                assert usage.completion_tokens == STREAM_TOKENS
                assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
            assert lb.metrics.migrations.get("died", 0) >= 1
            assert not lb.metrics.migrations_refused
        finally:
            await client.close()
            await runner.cleanup()
            await lb.close()

    with ExitStack() as stack:
        run(scenario(*_sims(stack, 2, UNENDING)), timeout=60)
