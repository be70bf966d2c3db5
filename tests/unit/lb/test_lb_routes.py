"""Every route through a real load balancer in front of fake PD workers (real sockets).

The fake workers check the PD protocol on their side (bootstrap fields present, the same body
on both legs, host and bootstrap port of the chosen prefill); `running_cluster` fails the test
if they saw a problem.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support.fake_worker import MODEL, lp, out_token, prompt_ids
from tests.support.lb_cluster import run, running_cluster, sse_events


def test_generate_returns_the_decode_answer_and_both_legs_get_the_same_body():
    async def scenario():
        async with running_cluster(2, 2) as c:
            status, body, headers = await c.post(
                "/generate",
                {"text": "hello there", "sampling_params": {"max_new_tokens": 3}},
                headers={"X-Request-Id": "req-1"},
            )
            assert status == 200 and headers["X-Request-Id"] == "req-1"
            assert body["text"] == " t0 t1 t2" and body["meta_info"]["completion_tokens"] == 3
            sent = c.all_requests()
            assert len(sent) == 2 and sent[0][1] == sent[1][1]
            assert "bootstrap_room" in sent[0][1]

    run(scenario())


@pytest.mark.parametrize("field", ["text", "input_ids"])
def test_batched_generate_gets_one_room_per_prompt(field):
    async def scenario():
        prompts = ["a b", "c d e", "f"] if field == "text" else [[1, 2], [3, 4, 5], [6]]
        async with running_cluster(1, 1) as c:
            status, body, _ = await c.post("/generate", {field: prompts})
            assert status == 200 and isinstance(body, list) and len(body) == 3
            (_, sent), _ = c.all_requests()
            assert len(sent["bootstrap_room"]) == 3 and len(set(sent["bootstrap_room"])) == 3
            assert sent["bootstrap_host"] == ["127.0.0.1"] * 3
            assert sent["bootstrap_port"] == [c.prefill[0].bootstrap_port] * 3

    run(scenario())


def test_generate_with_return_logprob_merges_prefill_input_logprobs():
    async def scenario():
        async with running_cluster(1, 1) as c:
            status, body, _ = await c.post(
                "/generate",
                {
                    "text": ["one two three", "four"],
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 2},
                },
            )
            assert status == 200
            for item, text in zip(body, ["one two three", "four"], strict=True):
                ids = prompt_ids(text)
                meta = item["meta_info"]
                assert [t for _, t, _ in meta["input_token_logprobs"]] == ids
                assert meta["input_token_logprobs"][0][0] is None
                assert [t for _, t, _ in meta["output_token_logprobs"]] == [500, 501]

    run(scenario())


def test_generate_stream_passes_decode_bytes_through_unchanged():
    async def scenario():
        async with running_cluster(1, 1) as c:
            payload = {
                "text": "stream me",
                "stream": True,
                "sampling_params": {"max_new_tokens": 5},
            }
            status, raw, headers = await c.post("/generate", payload)
            assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
            decode = c.decode[0]
            expected = b"".join(decode.events("/generate", decode.requests[0][1]))
            assert raw == expected + b"data: [DONE]\n\n"

    run(scenario())


def test_generate_stream_with_logprobs_merges_every_event():
    async def scenario():
        async with running_cluster(1, 1) as c:
            status, raw, _ = await c.post(
                "/generate",
                {
                    "text": "a b c",
                    "stream": True,
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 3},
                },
            )
            assert status == 200
            events = sse_events(raw)
            assert events[-1] == b"[DONE]" and len(events) == 4
            for event in events[:-1]:
                ids = [t for _, t, _ in event["meta_info"]["input_token_logprobs"]]
                assert ids == prompt_ids("a b c")

    run(scenario())


def test_completions_with_echo_and_logprobs_merge_the_prompt_part():
    async def scenario():
        async with running_cluster(1, 1) as c:
            req = {"prompt": "x y z", "echo": True, "logprobs": 1, "max_tokens": 2, "model": MODEL}
            status, body, _ = await c.post("/v1/completions", req)
            assert status == 200
            lps = body["choices"][0]["logprobs"]
            ids = prompt_ids("x y z")
            assert lps["tokens"] == [f"p{t}" for t in ids] + [" t0", " t1"]
            assert lps["token_logprobs"][0] is None
            assert lps["token_logprobs"][-1] == lp(out_token(1)[0], len(ids) + 1)
            status, raw, _ = await c.post("/v1/completions", {**req, "stream": True})
            events = sse_events(raw)
            first = events[0]["choices"][0]["logprobs"]
            assert first["tokens"] == [f"p{t}" for t in ids] + [" t0"]
            assert events[1]["choices"][0]["logprobs"]["tokens"] == [" t1"]

    run(scenario())


def test_completions_without_echo_are_not_touched():
    async def scenario():
        async with running_cluster(1, 1) as c:
            status, body, _ = await c.post(
                "/v1/completions", {"prompt": "x", "logprobs": 1, "max_tokens": 2}
            )
            assert status == 200
            assert body["choices"][0]["logprobs"]["tokens"] == [" t0", " t1"]

    run(scenario())


def test_openai_client_chat_completion_streams_and_not():
    async def scenario():
        async with running_cluster(2, 2, env={"PDKIT_LB_API_KEY": "sk-test"}) as c:
            client = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key="sk-test", max_retries=0)
            try:
                messages = [{"role": "user", "content": "hello"}]
                reply = await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=3, logprobs=True
                )
                assert reply.choices[0].message.content == " t0 t1 t2"
                assert [t.token for t in reply.choices[0].logprobs.content] == [" t0", " t1", " t2"]
                stream = await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=4, stream=True
                )
                text = ""
                async for chunk in stream:
                    text += chunk.choices[0].delta.content or ""
                assert text == " t0 t1 t2 t3"
                models = await client.models.list()
                assert [m.id for m in models.data] == [MODEL]
                completion = await client.completions.create(
                    model=MODEL, prompt="p q", max_tokens=2
                )
                assert completion.choices[0].text == " t0 t1"
            finally:
                await client.close()

    run(scenario())


def test_model_info_server_info_health_and_readiness():
    async def scenario():
        async with running_cluster(2, 1) as c:
            status, info, _ = await c.get("/model_info")
            assert status == 200 and info["disaggregation_mode"] == "prefill"
            status, info, _ = await c.get("/get_model_info")
            assert status == 200
            c.decode[0].fail_status = 500
            status, info, _ = await c.get("/server_info")
            assert status == 200
            assert [e["info"]["port"] for e in info["prefill"]] == [w.port for w in c.prefill]
            assert "HTTP 500" in info["decode"][0]["error"]
            assert info["internal_states"] == []
            c.decode[0].fail_status = None
            status, info, _ = await c.get("/server_info")
            assert info["internal_states"] == [{"last_gen_throughput": 1.5}]
            status, body, _ = await c.get("/health")
            assert (status, body) == (200, {"status": "ok", "started": c.lb.started})
            status, body, _ = await c.get("/readiness")
            assert status == 200 and body["ready"] and body["prefill"] == {"healthy": 2, "total": 2}

    run(scenario())


def test_unknown_routes_and_methods_get_json_errors():
    async def scenario():
        async with running_cluster(1, 1) as c:
            status, body, _ = await c.get("/nope")
            assert status == 404 and body["error"]["code"] == 404
            status, body, _ = await c.get("/generate")
            assert status == 405 and "GET is not allowed" in body["error"]["message"]

    run(scenario())


def test_metrics_count_requests_latency_tokens_and_workers():
    async def scenario():
        async with running_cluster(1, 1) as c:
            await c.post("/generate", {"text": "x"})
            await c.post("/generate", {"text": "x", "stream": True})
            await c.post("/generate", data=b"{bad")
            await c.post("/generate", {"input_ids": [1] * 300})
            status, raw, headers = await c.get("/metrics")
            text = raw.decode()
            assert status == 200 and headers["Content-Type"].startswith("text/plain")
            assert 'pdkit_lb_requests_total{route="/generate",status="200"} 3.0' in text
            # As they arrive: the bad request never reaches dispatch; "x" counts 1 token.
            assert "pdkit_lb_received_total 3.0" in text
            assert "pdkit_lb_received_prompt_tokens_total 302.0" in text
            assert 'pdkit_lb_requests_total{route="/generate",status="400"} 1.0' in text
            assert 'pdkit_lb_errors_total{cause="bad_request"} 1.0' in text
            assert (
                'pdkit_lb_request_duration_seconds_count{route="/generate",stream="true"} 1.0'
                in text
            )
            assert 'pdkit_lb_time_to_first_token_seconds_count{route="/generate"} 1.0' in text
            assert 'pdkit_lb_inter_token_latency_seconds_count{route="/generate"} 3.0' in text
            prefill = c.prefill[0].url
            assert f'pdkit_lb_worker_healthy{{role="prefill",worker="{prefill}"}} 1.0' in text
            assert f'pdkit_lb_worker_inflight{{role="prefill",worker="{prefill}"}} 0.0' in text
            assert "pdkit_lb_draining 0.0" in text

    run(scenario())


def test_every_answer_names_its_request_id_and_pd_path():
    async def scenario():
        async with running_cluster(2, 2) as c:
            status, _, headers = await c.post("/generate", {"text": "hi", "stream": True})
            assert status == 200
            (_, sent), _ = c.all_requests()
            assert headers["X-PDKit-Bootstrap-Room"] == str(sent["bootstrap_room"])
            prefill, decode = headers["X-PDKit-Prefill"], headers["X-PDKit-Decode"]
            assert prefill in {w.url for w in c.prefill} and decode in {w.url for w in c.decode}
            assert len(headers["X-Request-Id"]) == 16  # made up when the client sends none
            status, path, _ = await c.get(f"/requests?id={headers['X-Request-Id']}")
            assert status == 200
            assert (path["prefill"], path["decode"], path["state"], path["status"]) == (
                prefill,
                decode,
                "done",
                200,
            )
            assert path["bootstrap_room"] == sent["bootstrap_room"]

    run(scenario())


def test_a_client_that_gave_up_can_ask_where_its_request_is_stuck():
    async def scenario():
        async with running_cluster(1, 1) as c:
            c.decode[0].hang = True
            request = asyncio.ensure_future(
                c.post("/generate", {"text": "x", "stream": True}, headers={"X-Request-Id": "r9"})
            )
            await c.wait_for(lambda: c.decode[0].requests, what="the decode to get the request")
            status, path, _ = await c.get("/requests?id=r9")
            assert status == 200 and path["state"] == "in_flight"
            assert path["decode"] == c.decode[0].url and path["status"] is None
            request.cancel()
            status, body, _ = await c.get("/requests?id=nope")
            assert status == 404 and "no recent request" in body["error"]["message"]

    run(scenario())
