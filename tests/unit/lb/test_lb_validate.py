"""What the router refuses before a worker sees it (kit/lb/validate.py)."""

from __future__ import annotations

import pytest

from kit.lb.validate import check_ids, check_length, check_request, max_new_tokens, sent_ids


def test_an_id_past_the_vocabulary_is_refused_naming_it():
    refusal = check_ids([1, 2, 1000], 1000, param="input_ids")
    assert refusal.cause == "token_out_of_vocabulary"
    assert refusal.param == "input_ids"
    assert "input_ids[2] is 1000" in refusal.message
    assert "[0, 1000)" in refusal.message


def test_a_negative_id_is_refused():
    assert check_ids([-1], 10, param="prompt").cause == "token_out_of_vocabulary"


def test_ids_in_the_vocabulary_pass():
    assert check_ids([0, 9], 10, param="input_ids") is None


def test_an_empty_id_list_is_refused_as_sglang_words_it():
    assert check_ids([], 10, param="input_ids").message == "input_ids cannot be empty."


def test_a_prompt_filling_the_context_is_refused():
    refusal = check_length(2048, None, 2048)
    assert refusal.message == (
        "The input (2048 tokens) is longer than the model's context length (2048 tokens)."
    )
    assert check_length(2047, None, 2048) is None


def test_a_prompt_plus_its_budget_past_the_context_is_refused():
    refusal = check_length(2000, 49, 2048)
    assert refusal.param == "max_tokens"
    assert "a total of 2049 tokens" in refusal.message
    assert check_length(2000, 48, 2048) is None


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/generate", {"sampling_params": {"max_new_tokens": 7}}, 7),
        ("/generate", {}, None),
        ("/v1/completions", {}, 16),
        ("/v1/completions", {"max_tokens": 3}, 3),
        ("/v1/chat/completions", {}, None),
        ("/v1/chat/completions", {"max_tokens": 5}, 5),
        ("/v1/chat/completions", {"max_completion_tokens": 6, "max_tokens": 5}, 6),
        ("/v1/chat/completions", {"max_completion_tokens": 0, "max_tokens": 5}, 5),
    ],
)
def test_the_budget_is_read_as_sglang_reads_it(path, body, expected):
    assert max_new_tokens(path, body) == expected


def test_sent_ids_per_endpoint():
    assert sent_ids("/generate", {"input_ids": [1, 2]}) == ("input_ids", [[1, 2]])
    assert sent_ids("/generate", {"input_ids": [[1], [2, 3]]}) == ("input_ids", [[1], [2, 3]])
    assert sent_ids("/v1/completions", {"prompt": [4]}) == ("prompt", [[4]])
    assert sent_ids("/v1/completions", {"prompt": ["text"]}) is None
    assert sent_ids("/v1/completions", {"prompt": "text"}) is None
    assert sent_ids("/v1/chat/completions", {"input_ids": [9]}) == ("input_ids", [[9]])


def test_check_request_refuses_a_batch_row_out_of_vocabulary():
    body = {"input_ids": [[1, 2], [3, 99]]}
    refusal = check_request("/generate", body, None, vocab_size=50, context_length=100)
    assert refusal.cause == "token_out_of_vocabulary"


def test_check_request_checks_the_length_of_known_ids():
    body = {"prompt": "x", "max_tokens": 20}
    refusal = check_request("/v1/completions", body, [1] * 90, vocab_size=50, context_length=100)
    assert refusal.param == "max_tokens"
    assert check_request("/v1/completions", body, None, vocab_size=50, context_length=100) is None
    assert (
        check_request("/v1/completions", body, [1] * 90, vocab_size=50, context_length=None) is None
    )
