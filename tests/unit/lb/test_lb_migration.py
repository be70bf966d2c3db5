"""Stream migration: a stream cut by a dead or stalled decode goes on on another pair."""

from __future__ import annotations

import json

from kit.lb import migrate
from kit.lb.protocol import parse_request
from tests.support.lb_cluster import run, running_cluster, sse_events

RR = ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
PROMPT = [11, 12, 13]


def _generate(tokens: int) -> dict:
    return {"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": tokens}}


def test_only_a_generate_stream_with_input_ids_continues_exactly():
    def why(path: str, body: dict) -> str | None:
        return migrate.refusal(parse_request(path, json.dumps(body).encode()))

    assert why("/generate", _generate(4)) is None
    assert "text" in why("/generate", {"text": "hi", "stream": True})
    assert "token ids" in why("/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert "token ids" in why("/v1/completions", {"prompt": [1, 2], "stream": True})
    assert "n > 1" in why("/generate", {**_generate(4), "sampling_params": {"n": 2}})
    assert "logprobs" in why("/generate", {**_generate(4), "return_logprob": True})


def test_the_continuation_carries_the_tokens_sent_and_the_budget_left():
    pd = parse_request("/generate", json.dumps(_generate(5)).encode())
    sent = migrate.sent_so_far(
        pd,
        b'data: {"text":" a b","output_ids":[7,8],"meta_info":{"prompt_tokens":3,'
        b'"completion_tokens":2}}\n\n',
    )
    following = migrate.continuation(pd, sent)
    assert following is not None
    assert following.body["input_ids"] == [*PROMPT, 7, 8]
    assert following.body["sampling_params"]["max_new_tokens"] == 3
    rewritten = json.loads(
        migrate.Rejoin(sent).event(
            b'{"text":" c","output_ids":[9],"meta_info":{"prompt_tokens":5,"completion_tokens":1}}'
        )
    )
    assert rewritten["text"] == " a b c" and rewritten["output_ids"] == [7, 8, 9]
    assert rewritten["meta_info"] == {"prompt_tokens": 3, "completion_tokens": 3}
    everything = migrate.sent_so_far(pd, b'data: {"output_ids":[1,2,3,4,5]}\n\n')
    assert migrate.continuation(pd, everything) is None


def test_a_stream_whose_decode_dies_continues_on_another_pair_unbroken():
    async def scenario():
        async with running_cluster(2, 2, args=RR) as c:
            c.decode[0].die_after_tokens = 2
            status, raw, _ = await c.post("/generate", _generate(5))
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]" and not any("error" in e for e in events[:-1])
            last = events[-2]
            # two tokens from the dead decode, three from the next: one stream, usage counted
            assert last["output_ids"] == [500, 501, 500, 501, 502]
            assert last["meta_info"]["completion_tokens"] == 5
            assert last["meta_info"]["prompt_tokens"] == len(PROMPT)
            assert [e["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 4, 5]
            _, body = c.decode[1].requests[-1]
            assert body["input_ids"] == [*PROMPT, 500, 501]
            assert body["sampling_params"]["max_new_tokens"] == 3
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_migrations_total{reason="died"} 1.0' in metrics

    run(scenario())


def test_a_stalled_stream_is_migrated_and_its_stalled_leg_cancelled():
    async def scenario():
        async with running_cluster(1, 2, args=[*RR, "--stall-timeout", "0.3"]) as c:
            c.decode[0].token_delay = 5.0  # the first token comes, then nothing
            status, raw, _ = await c.post("/generate", _generate(3))
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]" and events[-2]["meta_info"]["completion_tokens"] == 3
            await c.wait_for(lambda: c.decode[0].cancelled, what="the stalled leg cancelled")
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_migrations_total{reason="stalled"} 1.0' in metrics

    run(scenario())


def test_a_cut_chat_stream_ends_with_an_error_saying_it_cannot_continue_exactly():
    async def scenario():
        async with running_cluster(1, 2, args=RR) as c:
            c.decode[0].die_after_tokens = 2
            status, raw, _ = await c.post(
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5},
            )
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]"
            assert "would not be exact" in events[-2]["error"]["message"]
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_migrations_refused_total{reason="inexact"} 1.0' in metrics

    run(scenario())


def test_migrations_share_the_retry_budget():
    async def scenario():
        async with running_cluster(1, 2, args=[*RR, "--retries", "1"]) as c:
            for worker in c.decode:
                worker.die_after_tokens = 1
            status, raw, _ = await c.post("/generate", _generate(5))
            events = sse_events(raw)
            assert status == 200 and "--retries" in events[-2]["error"]["message"]

    run(scenario())


def test_a_completions_stream_whose_decode_dies_continues_from_its_ids():
    async def scenario():
        async with running_cluster(1, 2, args=RR) as c:
            c.decode[0].die_after_tokens = 2
            body = {"prompt": PROMPT, "stream": True, "max_tokens": 5}
            status, raw, _ = await c.post("/v1/completions", body)
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]" and not any("error" in e for e in events[:-1])
            chunks = [e["choices"][0] for e in events[:-1]]
            assert all("token_ids" not in chunk for chunk in chunks)  # the client did not ask
            assert chunks[-1]["finish_reason"] == "length"
            (path, following), *_ = [r for r in c.decode[1].requests]
            assert path == "/v1/completions" and following["prompt"] == [*PROMPT, 500, 501]
            assert following["max_tokens"] == 3 and following["return_token_ids"] is True
            assert c.lb.metrics.migrations == {"died": 1}

    run(scenario())


def test_a_continuation_whose_prefill_fails_goes_on_on_another_prefill():
    """The stream's decode dies, then the first continuation's prefill answers 500: the
    continuation is sent again (without that prefill), as a first send would be."""

    async def scenario():
        async with running_cluster(3, 2, args=RR) as c:
            c.decode[0].die_after_tokens = 2
            c.prefill[1].fail_status = 500
            status, raw, _ = await c.post("/generate", _generate(5))
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]" and not any("error" in e for e in events[:-1]), events
            assert events[-2]["output_ids"] == [500, 501, 500, 501, 502]
            assert [body["input_ids"] for _, body in c.prefill[1].requests] == [[*PROMPT, 500, 501]]
            others = [
                body["input_ids"] for p in (c.prefill[0], c.prefill[2]) for _, body in p.requests
            ]
            assert sorted(others) == [PROMPT, [*PROMPT, 500, 501]], others
            _, metrics, _ = await c.get("/metrics")
            assert b'pdkit_lb_migrations_total{reason="died"} 2.0' in metrics

    run(scenario())
