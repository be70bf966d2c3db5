"""A sim 1P1D pair behind the real SGLang Model Gateway (smg 1.13.0) in PD mode."""

from __future__ import annotations

import asyncio
import subprocess
import time

import openai
import pytest

from kit.deploy.routing import RouterAdmin
from tests.support.ports import free_port
from tests.support.requires import require_smg
from tests.support.sim_launch import SimProcess, request_json, worker_argv

FAST = {"PDKIT_SIM_SPEED": "10", "PDKIT_SIM_LOAD_SECONDS": "0.3"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    smg = require_smg()
    bootstrap = free_port()
    prefill = SimProcess(
        worker_argv(port=free_port(), mode="prefill", bootstrap_port=bootstrap), env=FAST
    ).start()
    decode = SimProcess(worker_argv(port=free_port(), mode="decode"), env=FAST).start()
    router = None
    log = (tmp_path_factory.mktemp("smg") / "smg.log").open("wb")
    try:
        # pdkit starts the router behind the workers' readiness gates; so does this test.
        prefill.wait_ready()
        decode.wait_ready()
        port, metrics = free_port(), free_port()
        router = subprocess.Popen(
            [
                smg,
                "launch",
                "--pd-disaggregation",
                "--prefill",
                prefill.url,
                str(bootstrap),
                "--decode",
                decode.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(metrics),
                "--worker-startup-check-interval",
                "1",
                "--shutdown-grace-period-secs",
                "1",
                "--log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if request_json(url + "/readiness", timeout_s=2)[0] == 200:
                    break
            except OSError:
                pass
            if router.poll() is not None:
                pytest.fail(f"smg exited with {router.returncode}")
            time.sleep(0.1)
        else:
            pytest.fail("smg never became ready")
        yield url, decode
    finally:
        if router is not None:
            router.terminate()
            try:
                router.wait(5)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        log.close()
        prefill.stop()
        decode.stop()


def test_chat_completion_through_smg(gateway):
    url, decode = gateway
    before = request_json(decode.url + "/server_info")[1]["sim"]["kv_transfers"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Hello through smg"}], max_tokens=9
    )
    assert reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].message.content.split()) == 9
    assert request_json(decode.url + "/server_info")[1]["sim"]["kv_transfers"] == before + 1


def test_streamed_chat_completion_through_smg(gateway):
    url, _ = gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "Stream through smg"}],
            max_tokens=6,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_generate_through_smg(gateway):
    url, _ = gateway
    status, out = request_json(
        url + "/generate", {"text": "native API", "sampling_params": {"max_new_tokens": 4}}
    )
    assert status == 200 and out["meta_info"]["completion_tokens"] == 4


def test_pdkit_up_moves_smg_to_a_new_decode_without_failing_a_request(gateway):
    """What `pdkit up` does to smg's worker list live (kit.deploy.routing): a new decode joins
    and is routed to; the old one leaves while requests run on it, and they finish first."""
    url, decode = gateway
    spare = SimProcess(worker_argv(port=free_port(), mode="decode"), env=FAST).start()

    async def scenario() -> list[int]:
        async with RouterAdmin("smg", url, None, drain_timeout=60) as admin:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            running = [
                asyncio.ensure_future(
                    client.completions.create(
                        model="llama",
                        prompt="long",
                        max_tokens=400,
                        extra_body={"ignore_eos": True},
                    )
                )
                for _ in range(3)
            ]
            await asyncio.sleep(0.5)
            await admin.add(spare.url, "decode", None)
            assert (await admin.wait_routed(spare.url, 30)).routed
            # smg lists it as draining until its requests finished: remove() waits for that.
            drained = await admin.remove(decode.url)
            assert drained.clean and all(r.done() for r in running)
            assert decode.url not in await admin.workers()
            done = await asyncio.gather(*running)
            # Back as it was, for any test after this one.
            await admin.add(decode.url, "decode", None)
            await admin.wait_routed(decode.url, 30)
            await admin.remove(spare.url)
            await client.close()
            return [c.usage.completion_tokens for c in done]

    try:
        spare.wait_ready()
        assert asyncio.run(asyncio.wait_for(scenario(), 120)) == [400, 400, 400]
    finally:
        spare.stop()
