"""The word cache (`kit.lb.words`): plain ASCII text cut into the tokenizer's own pre-tokens and
encoded word by word gives exactly the tokenizer's ids, for GPT-2's, Llama 3's and Qwen 2's
pre-tokenizers; any other tokenizer gets no word cache."""

from __future__ import annotations

import random

import pytest
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

from kit.lb.segments import SegmentCache
from kit.lb.tokenizer import ModelTokenizer
from kit.lb.words import WordCache, byte_alphabet, plain
from tests.support.tokenizer_model import LLAMA3_SPLIT as LLAMA3
from tests.support.tokenizer_model import QWEN2_SPLIT as QWEN2
from tests.support.tokenizer_model import make_model

# Pieces that exercise each alternative: contractions in both cases (Llama 3's and Qwen 2's
# are case-insensitive, GPT-2's not), digit runs (cut in threes, in ones, or whole), runs of
# spaces before words and line ends, tabs, CRLF, punctuation with and without a space.
PIECES = [
    *"abcxyzABC012345 .,!?-_()[]{}<>|/\\\"'`~@#$%^&*+=:;",
    "'s", "'S", "'ll", "'LL", "'t", "'re", "'Ve", "'d", "'M",
    " the", " fox", "qui", "ck", "12345", "1234567", " 42",
    "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "  \n ", "\t\t",
    "...", " !!", "://", "--", "it's", "don't", "x\n", "a  b",
]  # fmt: skip


def _tokenizer(tmp_path, kind: str) -> Tokenizer:
    folder = make_model(tmp_path / kind)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if kind != "gpt2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(
                    Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated", invert=False
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return tok


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 60))) for _ in range(count)]


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "qwen2"])
def test_plain_text_is_cut_into_the_tokenizers_own_pre_tokens(tmp_path, kind):
    tok = _tokenizer(tmp_path, kind)
    words = WordCache.for_tokenizer(tok, None)
    assert words is not None
    alphabet = str.maketrans({chr(b): c for b, c in byte_alphabet().items()})
    for text in _texts(1, 2000):
        theirs = [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        assert [w.translate(alphabet) for w in words.split(text)] == theirs, repr(text)


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "qwen2"])
def test_plain_text_gets_the_tokenizers_ids_word_by_word(tmp_path, kind):
    tok = _tokenizer(tmp_path, kind)
    words = WordCache.for_tokenizer(tok, None)
    assert words is not None
    for text in _texts(2, 1500):
        assert words.encode(text) == tok.encode(text, add_special_tokens=False).ids, repr(text)
    assert len(words._words) > 100  # the words were kept, and found again


def test_the_byte_alphabet_is_the_byte_level_pre_tokenizers():
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = byte_alphabet()
    assert sorted(alphabet.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    for b in range(128):
        assert byte_level.pre_tokenize_str(chr(b))[0][0] == alphabet[b], b


def test_only_printable_ascii_tabs_and_line_ends_are_plain():
    assert plain("the fox\tjumps\r\n{ok}: 'yes' ~")
    for text in ("café", "a\x0bb", "a\x0cb", "\x1c", "\x00", "\x7f", "日本", "🚀"):
        assert not plain(text), repr(text)


def test_other_tokenizers_get_no_word_cache(tmp_path):
    def variant(change):
        tok = _tokenizer(tmp_path, "gpt2")
        change(tok)
        return WordCache.for_tokenizer(tok, None)

    def unknown_regex(tok):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\s+|\S+"), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    def prefix_space(tok):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)

    def normalizer(tok):
        tok.normalizer = normalizers.Lowercase()

    def whitespace(tok):
        tok.pre_tokenizer = pre_tokenizers.Whitespace()

    def dropout(tok):
        tok.model.dropout = 0.1

    for change in (unknown_regex, prefix_space, normalizer, whitespace, dropout):
        assert variant(change) is None, change.__name__


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "qwen2"])
def test_the_segment_cache_mixes_plain_and_other_text_exactly(tmp_path, kind):
    """Plain spans go word by word, others (accents, CJK, emoji, control characters) to the
    tokenizer: the whole text's ids either way, added tokens and long texts included."""
    tok = _tokenizer(tmp_path, kind)
    segments = SegmentCache.for_tokenizer(tok)
    assert segments is not None and segments._words is not None
    rng = random.Random(3)
    others = ["é", "日本", "🚀", "\x0b", "</s>", "<|user|>"]
    for _ in range(300):
        text = "".join(
            rng.choice(others) if rng.random() < 0.02 else rng.choice(PIECES)
            for _ in range(rng.randint(1, 900))
        )
        assert segments.encode(text) == tok.encode(text, add_special_tokens=False).ids, repr(text)


def test_the_routers_tokenizer_uses_the_word_cache(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m"))
    messages = [{"role": "user", "content": "the quick brown fox, twice: the fox"}]
    ids = tokenizer.chat_ids({"messages": messages})
    assert tokenizer._segments is not None and tokenizer._segments._words is not None
    assert " quick" in tokenizer._segments._words._words
    text = tokenizer.render_chat(messages)
    assert ids == tokenizer._tokenizer.encode(text, add_special_tokens=False).ids


def test_a_full_word_cache_starts_again_and_stays_exact(tmp_path, monkeypatch):
    monkeypatch.setattr("kit.lb.words.WORD_CACHE_WORDS", 16)
    tok = _tokenizer(tmp_path, "gpt2")
    words = WordCache.for_tokenizer(tok, None)
    assert words is not None
    for text in _texts(4, 200):
        assert words.encode(text) == tok.encode(text, add_special_tokens=False).ids
        assert len(words._words) <= 16
