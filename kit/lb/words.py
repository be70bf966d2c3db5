"""The router tokenizer's word cache: the ids of plain ASCII text put together word by word
(`WordCache.encode`), exactly the ids the tokenizer gives, at a fraction of its CPU.

Why it is exact. A byte-level BPE tokenizer (GPT-2's, Llama 3's, Qwen 2's) with no normalizer
cuts a text into pre-tokens with one regular expression, maps each pre-token's bytes to its
alphabet, and runs the BPE model on each pre-token on its own: a text's ids are the
concatenation of its pre-tokens' ids, and a pre-token's ids depend on nothing but its text.
So once a pre-token (" the", " quick", "ing") has been encoded, its ids are known wherever it
comes again. This module

1. cuts the text with the tokenizer's own regular expression, restricted to ASCII
   (`ASCII_SPLITS`: `\\p{L}` is `[A-Za-z]` there, `\\p{N}` `[0-9]`, `\\s` `[\\t\\n\\x0b\\x0c\\r ]`),
   and only for texts of printable ASCII, tabs and line ends (`plain`), where the two
   expressions match alike (Python's `re` and the tokenizer's Oniguruma are both leftmost-first
   backtracking engines; the unit tests compare the cuts with the tokenizer's pre-tokenizer on
   random texts);
2. looks each pre-token up in a dictionary of those seen before;
3. has the tokenizer's own BPE model encode those not seen yet (`Tokenizer.model.tokenize` on the
   pre-token in the byte-level alphabet: the model that the tokenizer runs on it).

Texts of other characters, and tokenizers of other pre-tokenizers, go to the tokenizer whole
(`WordCache.for_tokenizer` gives None for those).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tokenizers import Tokenizer

WORD_CACHE_WORDS = 1 << 16
"""Pre-tokens the word cache holds at most (about 10 MiB); it starts again empty past that."""

WORD_CHARS = 48
"""Longer pre-tokens (a run of spaces, an encoded blob) are encoded each time, not kept."""

_S = r"\t\n\x0b\x0c\r "

ASCII_SPLITS = {
    # GPT-2's (the ByteLevel pre-tokenizer's own regex)
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": (
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_S}A-Za-z0-9]+|[{_S}]+(?![^{_S}])"
        rf"|[{_S}]+"
    ),
    # Llama 3's
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": (
        rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]{{1,3}}"
        rf"| ?[^{_S}A-Za-z0-9]+[\r\n]*|[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
    ),
    # Qwen 2's
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": (
        rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
        rf"| ?[^{_S}A-Za-z0-9]+[\r\n]*|[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
    ),
}
"""The pre-tokenizer regexes this module knows, each with its ASCII restriction (`re` syntax)."""

GPT2_REGEX = next(iter(ASCII_SPLITS))

_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")


def plain(text: str) -> bool:
    """Whether `text` is printable ASCII, tabs and line ends only (the word cache's texts)."""
    return text.isascii() and _NOT_PLAIN.search(text) is None


def byte_alphabet() -> dict[int, str]:
    """The byte-level alphabet: each byte's character (GPT-2's `bytes_to_unicode`: printable
    Latin-1 bytes are themselves, the others follow 255 in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in kept}
    moved = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + moved)
            moved += 1
    return out


class WordCache:
    """Pre-token -> ids of one tokenizer, for plain ASCII text (see the module docstring).

    `ints` maps a vocabulary id to the one int object kept for it (`SegmentCache`'s), so that
    cached ids share their objects."""

    def __init__(self, tokenizer: Tokenizer, split: str, ints: Sequence[int] | None) -> None:
        self._model = tokenizer.model
        self._find = re.compile(split).findall
        self._ints = ints
        self._alphabet = str.maketrans({chr(b): c for b, c in byte_alphabet().items() if b < 128})
        self._words: dict[str, tuple[int, ...]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, ints: Sequence[int] | None) -> WordCache | None:
        """The word cache of a byte-level BPE tokenizer whose pre-tokenizer is one of
        `ASCII_SPLITS` (alone, or as a Split before a ByteLevel without its own regex), with
        no normalizer, no prefix space and no BPE dropout; None for any other."""
        try:
            spec = json.loads(tokenizer.to_str())
        except ValueError:
            return None
        model = spec.get("model") or {}
        if spec.get("normalizer") is not None or model.get("type") != "BPE":
            return None
        if model.get("dropout") not in (None, 0, 0.0):  # random merges: no word has one encoding
            return None
        pre = spec.get("pre_tokenizer") or {}
        if pre.get("type") == "ByteLevel":
            regex, byte_level = (GPT2_REGEX if pre.get("use_regex", True) else None), pre
        elif pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or []) == 2:
            split, byte_level = pre["pretokenizers"]
            if (
                split.get("type") != "Split"
                or split.get("behavior") != "Isolated"
                or split.get("invert") is not False
                or byte_level.get("type") != "ByteLevel"
                or byte_level.get("use_regex") is not False
            ):
                return None
            regex = (split.get("pattern") or {}).get("Regex")
        else:
            return None
        if regex not in ASCII_SPLITS or byte_level.get("add_prefix_space", False):
            return None
        return cls(tokenizer, ASCII_SPLITS[regex], ints)

    def split(self, text: str) -> list[str]:
        """`text`'s pre-tokens (`text` plain: see `plain`)."""
        return self._find(text)

    def encode(self, text: str) -> list[int] | None:
        """The ids of plain `text` (see `plain`); None where its pre-tokens do not cover it
        (which these regexes never leave, but then the tokenizer decides)."""
        words = self.split(text)
        cached = self._words
        ids: list[int] = []
        covered = 0
        for word in words:
            found = cached.get(word)
            if found is None:
                found = self._encode_word(word)
            ids += found
            covered += len(word)
        return ids if covered == len(text) else None

    def _encode_word(self, word: str) -> tuple[int, ...]:
        tokens = self._model.tokenize(word.translate(self._alphabet))
        ints = self._ints
        found = tuple(ints[t.id] if ints else t.id for t in tokens)
        if len(word) <= WORD_CHARS:
            if len(self._words) >= WORD_CACHE_WORDS:
                self._words.clear()
            self._words[word] = found
        return found
