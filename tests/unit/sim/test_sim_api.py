"""Request parsing and the HTTP API in-process (real sockets, no Mooncake)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest

from kit.sim.admission import Limits
from kit.sim.api_native import RequestRefused, parse_generate
from kit.sim.api_openai import StreamFormatter, parse_chat, parse_completion
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.tokens import OutputSource
from tests.support.sim_server import serve

VOCAB = 32000
LIMITS = Limits(context_len=4096, vocab=VOCAB, kv_capacity=100_000)


def test_generate_single_and_batch_with_pd_lists():
    inputs, as_list, stream = parse_generate({"text": "hello", "stream": True}, LIMITS)
    assert len(inputs) == 1 and not as_list and stream
    assert inputs[0].max_new_tokens == 128
    body = {
        "text": ["a", "bb"],
        "sampling_params": {"max_new_tokens": 3, "n": 2},
        "bootstrap_host": ["h1", "h2"],
        "bootstrap_port": [1, 2],
        "bootstrap_room": [10, 20],
    }
    inputs, as_list, _ = parse_generate(body, LIMITS)
    assert as_list and len(inputs) == 4
    assert [i.bootstrap_room for i in inputs] == [10, 11, 20, 21]
    assert [i.bootstrap_host for i in inputs] == ["h1", "h1", "h2", "h2"]
    ids, _, _ = parse_generate({"input_ids": [[5, 6, 7], [8]]}, LIMITS)
    assert [i.prompt_len for i in ids] == [3, 1]


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "Either text, input_ids or input_embeds should be provided."),
        (
            {"text": "x", "sampling_params": {"max_new_tokens": -1}},
            "max_new_tokens must be at least",
        ),
        ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature must be"),
        ({"text": "x", "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        (
            {"text": "x", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 2}},
            "min_new_tokens must be in",
        ),
        ({"text": ["a", "b"], "bootstrap_room": [1]}, "bootstrap_room has 1 items"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 5000}}, "maximum context length"),
    ],
)
def test_generate_errors_use_sglang_messages(body, message):
    with pytest.raises(RequestRefused) as err:
        parse_generate(body, LIMITS)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "field, value, openai_refuses",
    [
        ("bootstrap_room", "7", False),
        ("bootstrap_port", "8998", False),
        ("routed_dp_rank", "1", True),  # 1 is out of range on one DP rank
        ("bootstrap_host", 5, True),
    ],
)
def test_pd_fields_are_typed_as_sglang_types_them(field, value, openai_refuses):
    # /generate's JSON contract takes JSON types as they are; the OpenAI routes parse with
    # pydantic's lax mode, which reads "7" as 7. A refusal names the field.
    with pytest.raises(RequestRefused, match=field):
        parse_generate({"text": "x", field: value}, LIMITS)
    chat = {"messages": [{"role": "user", "content": "hi"}], field: value}
    for parse in (
        lambda: parse_completion({"prompt": "x", field: value}, LIMITS),
        lambda: parse_chat(chat, LIMITS),
    ):
        if openai_refuses:
            with pytest.raises(RequestRefused, match=field):
                parse()
        else:
            assert parse()[0].prompt_len > 0


def test_openai_bodies():
    chat = parse_chat(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "n": 2,
            "bootstrap_room": 7,
        },
        LIMITS,
    )
    assert [c.max_new_tokens for c in chat] == [4, 4]
    assert [c.bootstrap_room for c in chat] == [7, 8]
    assert parse_completion({"prompt": "x"}, LIMITS)[0].max_new_tokens == 16
    # No limit, or a max_completion_tokens of 0 (SGLang reads `max_completion_tokens or
    # max_tokens`): up to the context, which the engine caps.
    for body in ({}, {"max_completion_tokens": 0}):
        long = parse_chat({"messages": [{"role": "user", "content": "hi"}], **body}, LIMITS)
        assert long[0].max_new_tokens is None
    zero = parse_chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, LIMITS)
    assert zero[0].max_new_tokens == 0
    with pytest.raises(RequestRefused, match="max_tokens must be positive"):
        parse_completion({"prompt": "x", "max_tokens": 0}, LIMITS)
    with pytest.raises(RequestRefused, match="Messages cannot be empty"):
        parse_chat({"messages": []}, LIMITS)


def run(coro):
    return asyncio.run(coro)


def test_health_is_503_until_loaded_and_404_is_json():
    async def main():
        api, server = await serve([])
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/health")) as r:
                assert r.status == 503
            async with http.post(server.make_url("/generate"), json={"text": "x"}) as r:
                assert r.status == 503
            api.ready = True
            async with http.get(server.make_url("/health")) as r:
                assert r.status == 200
            async with http.get(server.make_url("/nope")) as r:
                assert (r.status, await r.json()) == (404, {"detail": "Not Found"})
            async with http.get(server.make_url("/metrics")) as r:
                assert r.status == 404  # only with --enable-metrics, as in SGLang
        await server.close()
        await api.engine.close()

    run(main())


def test_api_key_protects_all_but_health():
    async def main():
        api, server = await serve(["--api-key", "sekret"])
        api.ready = True
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/v1/models")) as r:
                assert (r.status, await r.json()) == (401, {"error": "Unauthorized"})
            headers = {"Authorization": "Bearer sekret"}
            async with http.get(server.make_url("/v1/models"), headers=headers) as r:
                assert r.status == 200
                assert (await r.json())["data"][0]["id"] == "llama"
            async with http.get(server.make_url("/health_generate")) as r:
                assert r.status == 200
        await server.close()
        await api.engine.close()

    run(main())


def test_pd_request_without_room_gets_sglangs_400():
    async def main():
        api, server = await serve(
            ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake"]
        )
        api.ready = True
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url("/generate"), json={"text": "x"}) as r:
                body = await r.json()
                assert r.status == 400
                assert body["error"]["message"].startswith(
                    "Invalid request: Disaggregated request received without bootstrap room id."
                )
            chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
            async with http.post(server.make_url("/v1/chat/completions"), json=chat) as r:
                body = await r.json()
                assert r.status == 400 and body["object"] == "error" and body["code"] == 400
            # The fake backend (decode only) makes up the KV: the request is served.
            async with http.post(
                server.make_url("/generate"),
                json={"text": "x", "bootstrap_room": 5, "sampling_params": {"max_new_tokens": 3}},
            ) as r:
                assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] == 3
        await server.close()
        await api.engine.close()

    run(main())


def test_loads_and_server_info_shapes():
    async def main():
        api, server = await serve(["--dp-size", "2", "--enable-metrics"])
        api.ready = True
        async with aiohttp.ClientSession() as http:
            async with http.get(server.make_url("/v1/loads?include=core,disagg")) as r:
                data = await r.json()
                assert [x["dp_rank"] for x in data["loads"]] == [0, 1]
                assert data["loads"][0]["disaggregation"]["mode"] == "null"
                assert "memory" not in data["loads"][0]
            async with http.get(server.make_url("/v1/loads?format=prometheus")) as r:
                assert 'sglang_num_running_reqs{dp_rank="1"} 0' in await r.text()
            async with http.get(server.make_url("/v1/loads?include=bogus")) as r:
                assert r.status == 400
            async with http.get(server.make_url("/server_info")) as r:
                info = await r.json()
                assert info["engine"] == "pdkit-sim" and info["dp_size"] == 2
                assert len(info["internal_states"]) == 2
            async with http.get(server.make_url("/metrics")) as r:
                assert 'sglang:num_running_reqs{dp_rank="1"' in await r.text()
        await server.close()
        await api.engine.close()

    run(main())


@pytest.mark.parametrize("chat", [True, False])
def test_fast_stream_chunks_equal_the_general_ones(chat):
    state = RequestState(GenerateInput("abc", [1, 2], 4), OutputSource(0, [1, 2]), None)
    fmt = StreamFormatter(chat, 'mo"del', [state])
    piece = ' "quoted" \\ ünï'
    delta = {"content": piece} if chat else piece
    assert fmt.content_chunk(0, piece) == fmt._chunk(0, delta, None)


def _sse(text):
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line != "data: [DONE]"
    ]


def test_completions_echo_the_prompt_and_its_logprobs_as_sglang_does():
    async def main():
        api, server = await serve([])
        api.ready = True
        url = server.make_url("/v1/completions")
        prompt = "the quick brown fox jumps"  # 25 bytes: 7 tokens
        async with aiohttp.ClientSession() as http:
            body = {"prompt": prompt, "max_tokens": 3, "echo": True, "n": 2}
            async with http.post(url, json=body) as r:
                choices = (await r.json())["choices"]
            assert [c["text"].startswith(prompt) for c in choices] == [True, True]
            assert all(len(c["text"]) > len(prompt) for c in choices)
            body = {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1}
            async with http.post(url, json=body) as r:
                [choice] = (await r.json())["choices"]
            lp = choice["logprobs"]
            # 7 prompt entries (the first without a logprob), then the 3 output tokens
            assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 7 + 3
            assert lp["token_logprobs"][0] is None and None not in lp["token_logprobs"][1:]
            assert lp["text_offset"] == [-1] * 10  # SGLang: "Not supported yet"
            assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"]) == 10
            # logprobs=0: the prompt is echoed, its logprobs are not (SGLang's `echo and logprobs`)
            body = {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 0}
            async with http.post(url, json=body) as r:
                [choice] = (await r.json())["choices"]
            assert choice["text"].startswith(prompt)
            assert (
                len(choice["logprobs"]["tokens"]) == 3 and choice["logprobs"]["top_logprobs"] == []
            )
            body = {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1, "stream": True}
            async with http.post(url, json=body) as r:
                chunks = [c for c in _sse(await r.text()) if c["choices"]]
            first = chunks[0]["choices"][0]
            assert first["text"].startswith(prompt)
            assert first["logprobs"]["token_logprobs"][0] is None
            assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks[:-1]) == 10
            assert not any(c["choices"][0]["text"].startswith(prompt) for c in chunks[1:])
            body = {"prompt": prompt, "max_tokens": 3}
            async with http.post(url, json=body) as r:
                assert not (await r.json())["choices"][0]["text"].startswith(prompt)
        await server.close()
        await api.engine.close()

    run(main())


def test_a_decode_reports_no_prompt_logprobs():
    """SGLang's decode computes no prompt: meta_info's input logprobs are empty lists (the
    prefill has them and the router merges them), in /generate and in an echo's logprobs."""
    state = RequestState(
        GenerateInput(
            "r", [101, 102, 103], 2, return_logprob=True, top_logprobs_num=2, logprob_start_len=0
        ),
        OutputSource(0, [101, 102, 103]),
        None,
    )
    assert len(state.logprob_meta()["input_token_logprobs"]) == 3
    state.decode_side = True
    meta = state.logprob_meta()
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []


def test_prompt_logprobs_follow_logprob_start_len():
    """SGLang returns prompt logprobs only from logprob_start_len on; its default (-1) none."""

    def meta(start: int) -> dict:
        request = GenerateInput("r", [101, 102, 103, 104], 1, return_logprob=True)
        request.logprob_start_len = start
        return RequestState(request, OutputSource(0, [101, 102, 103, 104]), None).logprob_meta()

    assert meta(-1)["input_token_logprobs"] == []
    full = meta(0)["input_token_logprobs"]
    assert [t for _, t, _ in full] == [101, 102, 103, 104] and full[0][0] is None
    assert meta(2)["input_token_logprobs"] == full[2:]


def test_openai_fields_are_read_as_pydantic_reads_them():
    """SGLang parses OpenAI bodies with pydantic's lax mode: "false" is False, "2" is 2."""

    async def main():
        api, server = await serve([])
        api.ready = True
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "stream": "false",
            "n": "2",
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(server.make_url("/v1/chat/completions"), json=body) as r,
        ):
            assert r.content_type == "application/json"
            assert len((await r.json())["choices"]) == 2
        await server.close()
        await api.engine.close()

    run(main())


@pytest.mark.parametrize("mode, dies", [([], True), (["--disaggregation-mode", "decode"], False)])
def test_an_out_of_vocabulary_id_kills_the_server_as_sglang_0_5_23(mode, dies):
    """SGLang checks no input id against the vocabulary: the embedding's IndexError kills a
    plain server (or a prefill); a decode embeds only its own output."""

    async def main():
        api, server = await serve(mode)
        api.ready = True
        crashes = []
        api.engine.on_fatal = crashes.append
        vocab = api.engine.model.vocab
        body = {"input_ids": [1, 2, vocab + 7], "sampling_params": {"max_new_tokens": 1}}
        if mode:
            body |= {"bootstrap_host": "2.2.2.2", "bootstrap_room": 1}
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url("/generate"), json={"input_ids": [1, 2, 3]}) as r:
                assert r.status == 200 or mode
            assert crashes == []
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.post(
                    server.make_url("/generate"),
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=2),
                ) as r:
                    await r.read()
        await server.close()
        await api.engine.close()
        return crashes

    crashes = run(main())
    if dies:
        assert len(crashes) == 1
        assert crashes[0].startswith("IndexError: index out of range in self")
    else:
        assert crashes == []
