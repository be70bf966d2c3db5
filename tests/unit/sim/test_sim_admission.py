"""The context-length rules and --allow-auto-truncate, as SGLang's tokenizer manager and
scheduler apply them (the differential test, tests/e2e/sglang/test_sim_matches_sglang_requests.py,
holds the sim to SGLang's own code; these pin the numbers)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kit.sim.admission import Limits, check_lengths, sampling_params
from kit.sim.args import parse_args
from kit.sim.errors import RequestRefused
from tests.support.sim_server import serve

LIMITS = Limits(context_len=256, vocab=1000, kv_capacity=10_000)
TRUNCATE = Limits(context_len=256, vocab=1000, kv_capacity=10_000, allow_auto_truncate=True)


def test_total_tokens_over_the_context_are_refused_with_sglangs_message():
    with pytest.raises(RequestRefused) as err:
        check_lengths([1] * 100, 157, LIMITS)
    assert str(err.value).startswith(
        "Requested token count exceeds the model's maximum context length of 256 tokens. "
        "You requested a total of 257 tokens: 100 tokens from the input messages and 157"
    )
    assert check_lengths([1] * 100, 156, LIMITS) == ([1] * 100, 156)
    # Without an explicit max_new_tokens there is nothing to check: the scheduler caps it.
    assert check_lengths([1] * 255, None, LIMITS) == ([1] * 255, None)
    with pytest.raises(RequestRefused, match=r"The input \(256 tokens\) is longer than"):
        check_lengths([1] * 256, None, LIMITS)


def test_auto_truncate_cuts_the_input_and_the_output_to_fit():
    assert check_lengths([1] * 100, 10**9, TRUNCATE) == ([1] * 100, 156)
    prompt, max_new = check_lengths(list(range(300)), 10, TRUNCATE)
    assert prompt == list(range(256)) and max_new == 0


def test_the_scheduler_keeps_five_tokens_of_margin_and_caps_new_tokens():
    # max_req_len = context - 1; inputs of max_req_len - 5 tokens or more are refused.
    assert LIMITS.max_req_input_len == 250
    assert LIMITS.admit_input(249) == (249, None)
    kept, refusal = LIMITS.admit_input(250)
    assert kept == 250 and refusal is not None and "--allow-auto-truncate" in refusal
    assert TRUNCATE.admit_input(300) == (250, None)
    assert LIMITS.cap_new_tokens(None, 200) == 54  # 255 - 200 - 1
    assert LIMITS.cap_new_tokens(10, 200) == 10
    # A small KV pool lowers the limits below the context, as in SGLang.
    assert Limits(context_len=256, vocab=1000, kv_capacity=101).max_req_input_len == 95


@pytest.mark.parametrize(
    "params, message",
    [
        ({"temperature": float("inf")}, "temperature must be a non-negative finite number"),
        ({"min_p": -0.1}, "min_p must be in [0, 1]"),
        ({"repetition_penalty": 2.5}, "repetition_penalty must be in (0, 2]"),
        ({"logit_bias": {"1000": 1.0}}, "logit_bias must has keys in [0, 999]"),
        ({"regex": "a+", "ebnf": "root ::= 'a'"}, "Only one of json_schema, regex"),
        ({"stop_regex": ["x" * 257]}, "stop_regex is 257 bytes"),
    ],
)
def test_sampling_params_are_verified_as_sglang_does(params, message):
    with pytest.raises(RequestRefused) as err:
        sampling_params(params, 1000)
    assert message in str(err.value)


def test_temperature_zero_is_greedy_and_top_k_minus_one_the_whole_vocabulary():
    assert sampling_params({"temperature": 0, "top_k": 0}, 1000).n == 1  # top_k becomes 1
    assert sampling_params({"top_k": -1}, 1000).max_new_tokens == 128


def test_request_shaping_flags_are_honoured_not_ignored():
    args = parse_args(
        ["--model-path", "m", "--allow-auto-truncate", "--enable-custom-logit-processor"]
    )
    assert args.allow_auto_truncate and args.enable_custom_logit_processor
    assert args.ignored == ()


def test_auto_truncate_over_http():
    """--context-length 64: a 40-token prompt asking 1000 tokens is a 400 without the flag;
    with it, the output is cut to what the context leaves: 24 by the tokenizer manager, 22
    by the scheduler (max_req_len 63, less the input, less 1)."""

    async def main() -> None:
        body = {
            "text": "abcd" * 40,
            "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True},
        }
        for flags, expected in (([], 400), (["--allow-auto-truncate"], 200)):
            api, server = await serve(["--context-length", "64", *flags])
            api.ready = True
            async with (
                aiohttp.ClientSession() as http,
                http.post(server.make_url("/generate"), json=body) as r,
            ):
                answer = await r.json()
            assert r.status == expected, answer
            if expected == 200:
                meta = answer["meta_info"]
                assert (meta["prompt_tokens"], meta["completion_tokens"]) == (40, 22)
            else:
                assert "maximum context length of 64 tokens" in answer["error"]["message"]
            await server.close()
            await api.engine.close()

    asyncio.run(main())
