"""Prompts are built to the token count asked, by the rule the sim counts with."""

from __future__ import annotations

import pytest

from kit.bench.prompts import PromptPlan, prompt_text, request_body
from kit.byte_tokenizer import count_text_tokens, render_chat
from kit.perf.workload import TRACE_BLOCK_TOKENS


@pytest.mark.parametrize("tokens", [7, 8, 64, 511, 2048])
def test_the_sim_counts_exactly_the_tokens_asked(tokens):
    plan = PromptPlan(tokens, seed=0, index=3)
    assert count_text_tokens(prompt_text(plan, "completions")) == tokens
    chat = render_chat([{"role": "user", "content": prompt_text(plan, "chat")}])
    assert count_text_tokens(chat) == tokens


def test_prompts_differ_by_request_and_repeat_by_seed():
    a, b = (prompt_text(PromptPlan(100, seed=0, index=i), "completions") for i in (1, 2))
    assert a != b
    assert prompt_text(PromptPlan(100, seed=0, index=1), "completions") == a
    assert prompt_text(PromptPlan(100, seed=9, index=1), "completions") != a


def test_a_group_shares_its_prefix_and_only_it():
    plans = [PromptPlan(200, seed=0, index=i, group=i % 2, prefix=120) for i in range(4)]
    texts = [prompt_text(p, "completions") for p in plans]
    head = 120 * 4
    assert texts[0][:head] == texts[2][:head] and texts[1][:head] == texts[3][:head]
    assert texts[0][:head] != texts[1][:head]
    assert texts[0][head:] != texts[2][head:]


def test_trace_blocks_are_the_same_text_wherever_their_hash_appears():
    first = prompt_text(PromptPlan(2 * TRACE_BLOCK_TOKENS, 0, 0, hash_ids=(7, 8)), "completions")
    second = prompt_text(PromptPlan(TRACE_BLOCK_TOKENS + 10, 0, 1, hash_ids=(7, 9)), "completions")
    block = TRACE_BLOCK_TOKENS * 4
    assert first[:block] == second[:block]
    assert count_text_tokens(second) == TRACE_BLOCK_TOKENS + 10


def test_the_body_asks_for_exactly_the_output_length():
    body = request_body("chat", "m", "hi", 64, stream=True)
    assert body["max_tokens"] == 64 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    plain = request_body("completions", "m", "hi", 8, stream=False)
    assert plain["prompt"] == "hi" and "stream_options" not in plain
