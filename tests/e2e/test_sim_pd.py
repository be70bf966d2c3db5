"""A sim prefill and a sim decode as real processes: SGLang's PD protocol, KV over Mooncake."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from kit.lb.logprobs import merge_body
from kit.lb.protocol import Merge
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, request_json, worker_argv

FAST = {"PDKIT_SIM_SPEED": "10", "PDKIT_SIM_LOAD_SECONDS": "0.3", "PDKIT_SIM_SEED": "5"}
ROOM = iter(range(1000, 10**6))


def start_pair(prefill_env=None, decode_env=None, extra=()):
    bootstrap = free_port()
    prefill = SimProcess(
        worker_argv(port=free_port(), mode="prefill", bootstrap_port=bootstrap, extra=extra),
        env={**FAST, **(prefill_env or {})},
    ).start()
    decode = SimProcess(
        worker_argv(port=free_port(), mode="decode", extra=extra),
        env={**FAST, **(decode_env or {})},
    ).start()
    return prefill, decode, bootstrap


@pytest.fixture(scope="module")
def pair():
    prefill, decode, bootstrap = start_pair(
        prefill_env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2"},
        decode_env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3"},
        # Two DP ranks on each side: the prefill rank holding a room is room % 2.
        extra=["--dp-size", "2"],
    )
    try:
        prefill.wait_ready()
        decode.wait_ready()
        yield prefill, decode, bootstrap
    finally:
        prefill.stop()
        decode.stop()


def pd_body(bootstrap, **body):
    return {
        **body,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap,
        "bootstrap_room": next(ROOM),
    }


def both(prefill, decode, path, body):
    """Send the same body to both legs at once, as a PD load balancer does."""
    with ThreadPoolExecutor(2) as pool:
        p = pool.submit(request_json, prefill.url + path, body)
        d = pool.submit(request_json, decode.url + path, body)
        return p.result(), d.result()


def test_generate_moves_the_kv_over_mooncake(pair):
    prefill, decode, bootstrap = pair
    before = request_json(decode.url + "/server_info")[1]["sim"]
    text = "The quick brown fox jumps over the lazy dog. " * 8  # 360 bytes: 90 tokens
    body = pd_body(
        bootstrap,
        text=text,
        sampling_params={"max_new_tokens": 8},
        return_logprob=True,
        logprob_start_len=0,
    )
    (p_status, p_out), (d_status, d_out) = both(prefill, decode, "/generate", body)
    assert (p_status, d_status) == (200, 200)
    # Prefill: one token, finish length 0, the input logprobs; decode: the real answer,
    # starting with the prefill's token.
    assert p_out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert len(p_out["meta_info"]["input_token_logprobs"]) == 90
    assert d_out["meta_info"]["completion_tokens"] == 8
    assert d_out["output_ids"][0] == p_out["output_ids"][0]
    assert d_out["meta_info"]["input_token_logprobs"] == []
    after = request_json(decode.url + "/server_info")[1]["sim"]
    moved = after["kv_bytes_moved"] - before["kv_bytes_moved"]
    assert moved == 90 * after["kv_bytes_per_token"] == 90 * 128  # 131072 B/token / 1024
    assert after["kv_checksums_ok"] == before["kv_checksums_ok"] + 1
    with urllib.request.urlopen(decode.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "pdkit_sim:kv_bytes_moved_total" in metrics
    assert "sglang:kv_transfer_alloc_ms_count{" in metrics
    with urllib.request.urlopen(prefill.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    # SGLang's per-transfer histograms, observed by the sender.
    assert "sglang:kv_transfer_latency_ms_bucket{" in metrics
    assert 'engine_type="prefill"' in metrics and "sglang:kv_transfer_speed_gb_s_sum{" in metrics
    loads = request_json(prefill.url + "/v1/loads?include=disagg")[1]["loads"][0]
    assert loads["disaggregation"]["kv_transfer_latency_ms"] > 0


def test_pd_output_equals_colocated_output_for_the_same_seed(pair):
    prefill, decode, bootstrap = pair
    body = pd_body(bootstrap, text="same seed", sampling_params={"max_new_tokens": 6})
    _, (_, d_out) = both(prefill, decode, "/generate", body)
    with SimProcess(worker_argv(port=free_port()), env=FAST) as solo:
        solo.wait_ready()
        _, s_out = request_json(
            solo.url + "/generate", {"text": "same seed", "sampling_params": {"max_new_tokens": 6}}
        )
    assert d_out["output_ids"] == s_out["output_ids"]


def test_batched_generate_takes_lists_of_bootstrap_fields(pair):
    prefill, decode, bootstrap = pair
    body = {
        "text": ["first prompt", "second, longer prompt"],
        "sampling_params": {"max_new_tokens": 3},
        "bootstrap_host": ["127.0.0.1"] * 2,
        "bootstrap_port": [bootstrap] * 2,
        "bootstrap_room": [next(ROOM), next(ROOM)],
    }
    (p_status, _), (d_status, d_out) = both(prefill, decode, "/generate", body)
    assert (p_status, d_status) == (200, 200)
    assert [o["meta_info"]["completion_tokens"] for o in d_out] == [3, 3]
    # Consecutive rooms land on both prefill DP ranks (follow_bootstrap_room).
    loads = request_json(prefill.url + "/v1/loads")[1]["loads"]
    assert all(rank["total_prefill_uncached_tokens"] > 0 for rank in loads)


def test_chat_through_both_legs_streamed(pair):
    prefill, decode, bootstrap = pair
    extra = {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap,
        "bootstrap_room": next(ROOM),
    }
    messages = [{"role": "user", "content": "Hello over PD"}]

    def leg(url, stream):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="llama", messages=messages, max_tokens=7, stream=stream, extra_body=extra
        )
        if not stream:
            return reply.choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)

    with ThreadPoolExecutor(2) as pool:
        p = pool.submit(leg, prefill.url, False)
        d = pool.submit(leg, decode.url, True)
        assert len(p.result().split()) == 1
        assert len(d.result().split()) == 7


def test_echo_logprobs_come_once_each_from_prefill_and_decode(pair):
    """/v1/completions with echo and logprobs: both legs echo the prompt text; only the
    prefill has prompt logprobs (SGLang's decode has empty input logprobs), so a router's
    merge holds each prompt token once and each output token once."""
    prefill, decode, bootstrap = pair
    prompt = "echo the prompt through both legs"  # 33 bytes: 9 tokens
    body = pd_body(bootstrap, prompt=prompt, max_tokens=5, echo=True, logprobs=1)
    (p_status, p_out), (d_status, d_out) = both(prefill, decode, "/v1/completions", body)
    assert (p_status, d_status) == (200, 200)
    p_lp, d_lp = p_out["choices"][0]["logprobs"], d_out["choices"][0]["logprobs"]
    assert d_out["choices"][0]["text"].startswith(prompt)
    assert len(p_lp["tokens"]) == 9 + 1  # the prompt, then the one token the prefill sampled
    assert len(d_lp["tokens"]) == 5 and None not in d_lp["token_logprobs"]
    merged = json.loads(
        merge_body(Merge.ECHO, json.dumps(p_out).encode(), json.dumps(d_out).encode())
    )
    lp = merged["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == p_lp["token_logprobs"][:9] + d_lp["token_logprobs"]
    assert len(lp["tokens"]) == len(lp["top_logprobs"]) == 9 + 5
    # native: the decode's input logprobs are empty lists, not the prompt's again
    body = pd_body(bootstrap, text=prompt, sampling_params={"max_new_tokens": 2})
    body |= {"return_logprob": True, "top_logprobs_num": 1}
    _, (_, d_native) = both(prefill, decode, "/generate", body)
    meta = d_native["meta_info"]
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []


def test_pd_request_without_room_gets_sglangs_400(pair):
    prefill, decode, _ = pair
    for worker in (prefill, decode):
        status, body = request_json(worker.url + "/generate", {"text": "x"})
        assert status == 400
        assert (
            "Disaggregated request received without bootstrap room id" in body["error"]["message"]
        )


def test_timeouts_use_sglangs_variables(pair):
    prefill, decode, bootstrap = pair
    t0 = time.monotonic()
    status, body = request_json(prefill.url + "/generate", pd_body(bootstrap, text="lonely"))
    assert status == 500 and "KVPoll.Bootstrapping" in body["message"]
    assert 1.9 < time.monotonic() - t0 < 6  # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=2
    t0 = time.monotonic()
    status, body = request_json(decode.url + "/generate", pd_body(bootstrap, text="lonely"))
    assert status == 500 and "KVPoll.WaitingForInput" in body["message"]
    assert 2.9 < time.monotonic() - t0 < 8  # SGLANG_DISAGGREGATION_WAITING_TIMEOUT=3
    status, body = request_json(
        decode.url + "/generate",
        {
            "text": "x",
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": free_port(),
            "bootstrap_room": next(ROOM),
        },
    )
    assert status == 500 and "Decode handshake failed" in body["message"]


def test_killed_prefill_fails_the_waiting_decode_request_promptly():
    prefill, decode, bootstrap = start_pair(
        decode_env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120"}
    )
    try:
        prefill.wait_ready()
        decode.wait_ready()
        client = openai.OpenAI(base_url=decode.url + "/v1", api_key="x", max_retries=0, timeout=60)
        extra = {
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bootstrap,
            "bootstrap_room": next(ROOM),
        }

        def ask():
            # Only the decode leg: its KV never comes, so it waits on the prefill.
            return client.chat.completions.create(
                model="llama",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                stream=True,
                extra_body=extra,
            )

        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(lambda: list(ask()))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                loads = request_json(decode.url + "/v1/loads?include=disagg")[1]
                if loads["loads"][0]["disaggregation"]["decode_transfer_queue_reqs"] == 1:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the decode request never reached the transfer queue")
            killed = time.monotonic()
            prefill.kill()
            with pytest.raises(openai.APIError, match="Lost connection with prefill"):
                future.result(timeout=30)
            assert time.monotonic() - killed < 5  # not the 120 s waiting timeout
        metrics = urllib.request.urlopen(decode.url + "/metrics", timeout=10).read().decode()
        assert 'sglang:num_transfer_failed_reqs_total{engine_type="decode"' in metrics
        assert request_json(decode.url + "/health")[0] == 200  # the decode stays up
    finally:
        prefill.stop()
        decode.stop()


FAULT_LINES = {
    # The transfer engine's own line (Mooncake, glog), then SGLang's words on both sides.
    "refuse": (
        "prefill",
        [
            "SocketHandShakePlugin: connect()127.0.0.1:1: Connection refused [111]",
            "Session 127.0.0.1:1 failed.",
            "Prefill transfer failed for request rank=0",
        ],
        "Failed to send kv chunk of",
    ),
    "hang": ("decode", ["timed out after 2.0s in KVPoll.WaitingForInput"], "WaitingForInput"),
    # SGLang checks the KV only with --disaggregation-enable-kv-checksum on both roles.
    "corrupt": ("prefill", ["KV checksum mismatch req="], "KV checksum mismatch"),
}
CHECKSUM = ["--disaggregation-enable-kv-checksum"]


@pytest.mark.parametrize("fault", FAULT_LINES)
def test_a_faulty_worker_fails_its_transfer_with_the_real_log_line(fault):
    side, lines, answer = FAULT_LINES[fault]
    timeouts = {
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2",
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2",
    }
    faulty = {**timeouts, "PDKIT_SIM_FAULT": fault}
    prefill, decode, bootstrap = start_pair(
        prefill_env=faulty if side == "prefill" else timeouts,
        decode_env=faulty if side == "decode" else timeouts,
        extra=CHECKSUM if fault == "corrupt" else (),
    )
    try:
        prefill.wait_ready()
        decode.wait_ready()
        body = pd_body(bootstrap, text="the quick brown fox", sampling_params={"max_new_tokens": 2})
        _, (status, reply) = both(prefill, decode, "/generate", body)
        assert status == 500
        assert answer in json.dumps(reply)
        time.sleep(0.2)  # the log lines are flushed as they are written
        log = prefill.log_path.read_text() + decode.log_path.read_text()
        for line in lines:
            assert line in log, log[-2000:]
    finally:
        prefill.stop()
        decode.stop()


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_corrupt_kv_without_the_checksum_flag_gives_fluent_wrong_tokens_silently(side):
    """SGLang's default: no KV check, so altered KV decodes into other words, status 200, and
    no line in either log (what sglang #12157's wrong layout looks like)."""
    faulty = {"PDKIT_SIM_FAULT": "corrupt"}
    prefill, decode, bootstrap = start_pair(
        prefill_env=faulty if side == "prefill" else None,
        decode_env=faulty if side == "decode" else None,
    )
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    try:
        prefill.wait_ready()
        decode.wait_ready()
        body = pd_body(bootstrap, text="the quick brown fox", sampling_params=params)
        (p_status, _), (status, reply) = both(prefill, decode, "/generate", body)
        with SimProcess(worker_argv(port=free_port()), env=FAST) as solo:
            solo.wait_ready()
            _, right = request_json(
                solo.url + "/generate", {"text": "the quick brown fox", "sampling_params": params}
            )
        assert (p_status, status) == (200, 200)
        assert reply["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
        assert reply["output_ids"][0] == right["output_ids"][0]  # the prefill's token
        assert reply["output_ids"] != right["output_ids"]
        assert reply["text"].split() and all(w.isalpha() for w in reply["text"].split())
        time.sleep(0.2)
        log = prefill.log_path.read_text() + decode.log_path.read_text()
        assert "checksum" not in log.lower() and "ERROR" not in log
        assert request_json(decode.url + "/server_info")[1]["sim"]["kv_corrupted"] == 1
    finally:
        prefill.stop()
        decode.stop()
