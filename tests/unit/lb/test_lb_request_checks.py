"""The router's request checks, wired (`kit.lb.validate` through `LoadBalancer`): what SGLang
would crash on or refuse gets a 400 in OpenAI's error shape before any worker sees it."""

from __future__ import annotations

import json
import logging

from tests.support.lb_cluster import run, running_cluster
from tests.support.tokenizer_model import make_model

RR = ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]


def _sent(c) -> int:
    return sum(len(w.requests) for w in [*c.prefill, *c.decode])


def test_ids_outside_the_vocabulary_get_a_400_and_reach_no_worker():
    async def scenario():
        async with running_cluster(1, 1, args=[*RR, "--prompt-tokens", "sim:1000"]) as c:
            status, body, _ = await c.post("/generate", {"input_ids": [1, 2, 999999999]})
            assert status == 400, body
            error = body["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == 400
            assert error["param"] == "input_ids" and "999999999" in error["message"]
            status, body, _ = await c.post("/v1/completions", {"prompt": [[5, -1]]})
            assert status == 400 and body["error"]["param"] == "prompt"
            assert _sent(c) == 0
            status, _, _ = await c.post("/generate", {"input_ids": [1, 2, 3]})
            assert status == 200
            _, metrics, _ = await c.get("/metrics")
            assert b'cause="token_out_of_vocabulary"' in metrics

    run(scenario())


def test_validation_off_passes_them_on():
    async def scenario():
        args = [*RR, "--prompt-tokens", "sim:1000", "--no-validate"]
        async with running_cluster(1, 1, args=args) as c:
            status, _, _ = await c.post("/generate", {"input_ids": [1, 2, 999999999]})
            assert status == 200 and _sent(c) == 2

    run(scenario())


def test_a_prompt_past_the_context_and_max_tokens_past_it(tmp_path):
    folder = make_model(tmp_path / "m")
    args = [*RR, "--prompt-tokens", f"model:{folder}", "--context-length", "32"]

    async def scenario():
        async with running_cluster(1, 1, args=args) as c:
            long = {"messages": [{"role": "user", "content": "the fox " * 40}]}
            status, body, _ = await c.post("/v1/chat/completions", long)
            assert status == 400 and "longer than the model's context" in body["error"]["message"]
            short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
            status, body, _ = await c.post("/v1/chat/completions", short)
            error = body["error"]
            assert status == 400 and error["param"] == "max_tokens"
            assert "maximum context length of 32 tokens" in error["message"]
            assert _sent(c) == 0
            short["max_tokens"] = 4
            status, _, _ = await c.post("/v1/chat/completions", short)
            assert status == 200

    run(scenario())


def test_known_ids_are_counted_as_they_are(tmp_path, caplog):
    folder = make_model(tmp_path / "m")
    args = [*RR, "--prompt-tokens", f"model:{folder}"]
    chat = {"messages": [{"role": "user", "content": "the quick brown fox " * 8}]}

    async def scenario():
        async with running_cluster(1, 1, args=args) as c:
            with caplog.at_level(logging.INFO, logger="kit.lb.access"):
                status, _, _ = await c.post("/v1/chat/completions", chat)
            assert status == 200
            ids = c.lb.tokenizer.chat_ids(chat)
            line = next(r.getMessage() for r in caplog.records if r.name == "kit.lb.access")
            assert json.loads(line.removeprefix("access "))["prompt_tokens"] == len(ids)
            _, metrics, _ = await c.get("/metrics")
            assert f"pdkit_lb_received_prompt_tokens_total {float(len(ids))}".encode() in metrics

    run(scenario())
