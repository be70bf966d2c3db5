"""A colocated sim worker as a real process: SGLang's HTTP API through real sockets."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import openai
import pytest

from kit.observe.prom import parse_metrics
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, request_json, worker_argv

FAST = {"PDKIT_SIM_SPEED": "20", "PDKIT_SIM_LOAD_SECONDS": "1.0", "PDKIT_SIM_SEED": "3"}


@pytest.fixture(scope="module")
def worker():
    port = free_port()
    proc = SimProcess(
        worker_argv(port=port, extra=["--max-running-requests", "64", "--watchdog-timeout", "600"]),
        env=FAST,
    ).start()
    try:
        # Right after start the worker answers, but 503 while the emulated model loads.
        deadline = time.monotonic() + 20
        early = None
        while time.monotonic() < deadline and early is None:
            try:
                early = request_json(proc.url + "/health", timeout_s=1)[0]
            except OSError:
                time.sleep(0.02)
        proc.early_health = early
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(worker):
    return openai.OpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0)


def test_health_is_503_while_loading_then_200(worker):
    assert worker.early_health == 503
    assert request_json(worker.url + "/health")[0] == 200
    assert request_json(worker.url + "/health_generate")[0] == 200
    assert "The server is fired up and ready to roll!" in worker.log()


def test_chat_completion_non_streamed(client):
    reply = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Say hello"}], max_tokens=12
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 12
    assert reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens == 9  # "<|user|>\nSay hello\n<|assistant|>\n": 33 bytes


def test_chat_completion_streamed_with_usage(client):
    stream = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 10
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10


def test_outputs_are_deterministic_for_the_seed(client):
    def ask():
        return (
            client.completions.create(model="llama", prompt="Once upon a time", max_tokens=8)
            .choices[0]
            .text
        )

    assert ask() == ask()


def test_completions_stream_n_and_logprobs(client):
    reply = client.completions.create(model="llama", prompt="abc", max_tokens=4, n=2, logprobs=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text != reply.choices[1].text
    assert len(reply.choices[0].logprobs.token_logprobs) == 4
    assert len(reply.choices[0].logprobs.top_logprobs[0]) == 2
    pieces = [
        c.choices[0].text
        for c in client.completions.create(model="llama", prompt="abc", max_tokens=5, stream=True)
        if c.choices
    ]
    assert len("".join(pieces).split()) == 5


def test_answer_ends_with_eos_unless_ignore_eos(client):
    free = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Tell me a story"}]
    )
    assert free.choices[0].finish_reason == "stop"
    assert 64 <= free.usage.completion_tokens <= 192  # PDKIT_SIM_ANSWER_TOKENS 128
    forced = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=300,
        extra_body={"ignore_eos": True},
    )
    assert forced.usage.completion_tokens == 300


def test_generate_variants(worker):
    url = worker.url + "/generate"
    status, one = request_json(
        url,
        {
            "text": "Hello",
            "sampling_params": {"max_new_tokens": 5},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
    )
    assert status == 200 and len(one["output_ids"]) == 5
    meta = one["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == 2 and len(meta["input_token_logprobs"]) == 2
    assert len(meta["output_token_logprobs"]) == 5
    # SGLang's default logprob_start_len (-1): output logprobs only
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 1}, "return_logprob": True}
    assert request_json(url, body)[1]["meta_info"]["input_token_logprobs"] == []
    status, batch = request_json(
        url, {"input_ids": [[1001, 1002], [1003]], "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200 and [b["meta_info"]["prompt_tokens"] for b in batch] == [2, 1]
    # A stop string taken from the output itself ends it early, trimmed.
    word = one["text"].split()[2]
    status, stopped = request_json(
        url, {"text": "Hello", "sampling_params": {"max_new_tokens": 5, "stop": [word]}}
    )
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in stopped["text"] and stopped["meta_info"]["completion_tokens"] == 3
    status, by_id = request_json(
        url,
        {
            "text": "Hello",
            "sampling_params": {"max_new_tokens": 5, "stop_token_ids": [one["output_ids"][1]]},
        },
    )
    assert by_id["meta_info"]["finish_reason"]["matched"] == one["output_ids"][1]


def test_generate_stream(worker):
    request = urllib.request.Request(
        worker.url + "/generate",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {"text": "Hi", "stream": True, "sampling_params": {"max_new_tokens": 6}}
        ).encode(),
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        lines = [line.decode().strip() for line in r if line.strip()]
    assert lines[-1] == "data: [DONE]"
    outputs = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert outputs[-1]["meta_info"]["completion_tokens"] == 6
    assert outputs[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(outputs) >= 2  # streamed as it was generated


@pytest.mark.parametrize(
    "path, body, status, key",
    [
        ("/generate", {"text": "x", "sampling_params": {"top_p": 2}}, 400, "error"),
        ("/generate", {"sampling_params": {}}, 400, "error"),
        ("/v1/chat/completions", {"model": "llama", "messages": []}, 400, "message"),
        ("/v1/completions", {"model": "llama", "prompt": "x", "max_tokens": -1}, 400, "message"),
    ],
)
def test_bad_requests_get_sglang_errors(worker, path, body, status, key):
    code, reply = request_json(worker.url + path, body)
    assert code == status and key in reply


def test_openai_errors_reach_the_client(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="llama", messages=[], max_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert [m.id for m in client.models.list().data] == ["llama"]


def test_info_loads_and_metrics(worker):
    _, info = request_json(worker.url + "/server_info")
    assert info["engine"] == "pdkit-sim" and info["sim"]["gpu"] == "H100-SXM"
    assert info["max_running_requests"] == 64 and "--watchdog-timeout" in info["ignored"]
    # SGLang's startup_time: phase durations (s); the sim's start time (epoch s) is its own key
    phases = info["startup_time"]
    assert set(phases) == {
        "load_weight",
        "kv_cache_allocation",
        "scheduler_e2e",
        "cuda_graph",
        "tokenizer_e2e",
    }
    assert phases["load_weight"] == pytest.approx(1.0, abs=0.5)  # PDKIT_SIM_LOAD_SECONDS
    assert phases["scheduler_e2e"] >= phases["load_weight"]
    assert set(phases["cuda_graph"]) == {
        "prefill",
        "decode",
        "target_verify",
        "draft_prefill",
        "draft_decode",
        "draft_extend",
    }
    assert time.time() - 600 < info["sim"]["started_at"] <= time.time()
    _, model = request_json(worker.url + "/model_info")
    assert model["disaggregation_mode"] == "null" and model["model_type"] == "llama"
    _, loads = request_json(worker.url + "/v1/loads?include=all")
    assert loads["loads"][0]["max_running_requests"] == 64
    # one request of its own, so the histograms have a series whatever ran before
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as r:
        before = parse_metrics(r.read().decode())
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    status, answer = request_json(worker.url + "/generate", body)
    assert status == 200
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'sglang:time_to_first_token_seconds_count{engine_type="unified"' in text
    # As SGLang's tokenizer manager: a finished request's prompt and generated tokens, by
    # is_streaming (an autoscaler divides them by sglang:num_requests for the mean lengths).
    after, meta = parse_metrics(text), answer["meta_info"]
    for name, grown in (
        ("sglang:prompt_tokens_total", meta["prompt_tokens"]),
        ("sglang:generation_tokens_total", meta["completion_tokens"]),
    ):
        assert (
            after.total(name, is_streaming="false")
            == (before.total(name, is_streaming="false") or 0) + grown
        ), name
    assert request_json(worker.url + "/flush_cache")[0] == 200


@pytest.mark.parametrize(
    "argv, env, code, needle",
    [
        (
            ["--model-path", "meta-llama/Llama-3.1-70B-Instruct"],
            {"PDKIT_SIM_GPU": "L40S"},
            1,
            "To fix: raise --tp-size",
        ),
        (["--model-path", "m", "--port", "x"], {}, 2, "--port"),
        (["--model-path", "m"], {"PDKIT_SIM_GPU": "TPU"}, 1, "PDKIT_SIM_GPU"),
    ],
)
def test_startup_failures_exit_with_a_reason(argv, env, code, needle):
    port = free_port()
    if "--port" not in argv:
        argv = [*argv, "--port", str(port)]
    proc = SimProcess(argv, env={**FAST, **env}, port=port).start()
    assert proc.proc is not None
    assert proc.proc.wait(30) == code
    assert needle in proc.log()


@pytest.mark.parametrize("taken", ["--port", "--disaggregation-bootstrap-port"])
def test_a_port_in_use_exits_1_naming_the_port_and_its_flag(taken):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        http_port = busy if taken == "--port" else free_port()
        extra = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(busy)]
        if taken == "--port":
            extra[-1] = str(free_port())
        argv = worker_argv(port=http_port, extra=extra)
        proc = SimProcess(argv, env={**FAST, "PDKIT_SIM_LOAD_SECONDS": "0"}, port=http_port).start()
        assert proc.proc is not None
        assert proc.proc.wait(30) == 1
        assert f"cannot listen on 127.0.0.1:{busy} ({taken} {busy}): address already in use" in (
            proc.log()
        )
