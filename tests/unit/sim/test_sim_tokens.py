"""The token rule and the emulated model's outputs."""

from __future__ import annotations

from kit.sim import tokens


def test_one_token_per_four_utf8_bytes():
    assert tokens.count_text_tokens("abcd") == 1
    assert tokens.count_text_tokens("abcde") == 2
    assert tokens.count_text_tokens("") == 1
    assert tokens.count_text_tokens("é" * 4) == 2  # 8 bytes
    assert len(tokens.encode("hello world!", 32000)) == tokens.count_text_tokens("hello world!")


def test_encoding_is_deterministic_and_in_vocab():
    ids = tokens.encode("The quick brown fox", 32000)
    assert ids == tokens.encode("The quick brown fox", 32000)
    assert all(tokens.WORD_ID_BASE <= i < 32000 for i in ids)


def test_chat_template():
    text = tokens.render_chat(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    )
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"


def test_outputs_are_deterministic_per_seed_and_prompt():
    def draw(seed, prompt, sample=0):
        source = tokens.OutputSource(seed, prompt, sample)
        return [source.next_token() for _ in range(20)]

    assert draw(0, [1, 2, 3]) == draw(0, [1, 2, 3])
    assert draw(0, [1, 2, 3]) != draw(1, [1, 2, 3])
    assert draw(0, [1, 2, 3]) != draw(0, [1, 2, 4])
    assert draw(0, [1, 2, 3], 0) != draw(0, [1, 2, 3], 1)
    assert tokens.decode(draw(0, [1])).startswith(" ")


def test_answer_length_around_the_mean():
    lengths = [tokens.OutputSource(0, [i]).answer_length(100) for i in range(200)]
    assert all(50 <= n <= 150 for n in lengths)
    assert tokens.OutputSource(0, [1]).answer_length(0) is None
