"""The router's tokenizer's cache of pieces: a text's ids put together from the ids of its parts
seen before, exactly the ids of the whole text (`kit.lb.tokenizer` uses it; the argument for
exactness is `SegmentCache`'s).

A text is cut at added tokens and, for the pre-tokenizers where that provably changes no id,
before a space that follows a letter about every `CUT_CHARS` characters (`cut_points`); a piece
seen before (a system prompt, a shared document, earlier turns) is not encoded again, and a long
piece that begins as the last one seen with its first characters takes the spans the two share
from it. What is new is encoded in one call of the tokenizer's `encode_batch_fast`.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from kit.lb.words import ASCII_SPLITS, GPT2_REGEX, WordCache, plain

SEGMENT_CACHE_TOKENS = 1 << 20
"""Token ids the segment cache holds at most (about 8 MiB of ints); the oldest go first."""

CUT_CHARS = 512
"""The segment cache cuts a long text about this often (characters), where a cut cannot change
an id (`cut_points`), so that a long shared prefix of plain text (a document, few-shot
examples) is encoded once."""

RECENT_TOKENS = 1 << 20
"""Token ids the memory of recent long pieces (`SegmentCache._recent`) holds at most, besides
the segment cache (it shares their ids with it)."""

HEAD_CHARS = 256
"""A long piece's first characters: the key under which the last one seen with them is kept."""

# Pre-tokenizer regexes for which a cut before a space that follows a letter is a pre-token
# boundary (no alternative matches a letter then a space, none looks behind): GPT-2's (the
# ByteLevel pre-tokenizer's own), Llama 3's and Qwen 2's (a Split before a ByteLevel): those the
# word cache knows.
_CUTTABLE_SPLITS = frozenset(ASCII_SPLITS) - {GPT2_REGEX}


class SegmentCache:
    """The rendered chat encoded piece by piece, the ids of each piece between added tokens kept.

    Exact by the argument SGLang 0.5.23 makes for its own parallel encode
    (entrypoints/openai/parallel_prompt_encode.py): a fast tokenizer first splits the text at
    added tokens and runs the pre-tokenizer and the model on each piece in between on its own,
    so cutting there cannot change an id. It holds when no normalizer runs before the split,
    no added token strips spaces or must be a single word, and the pre-tokenizer treats no
    piece differently for being first (Metaspace); `for_tokenizer` gives None otherwise.
    Pieces that recur across requests (a system prompt, a shared document, earlier turns) are
    then encoded once.

    The pieces (and spans, `_spans`) not seen before are encoded together in one call of the
    tokenizer's `encode_batch_fast`: the same ids as `encode` (the same pipeline, without the
    character offsets that nothing here reads), at about two thirds of its CPU."""

    def __init__(self, tokenizer: Tokenizer, added: Mapping[str, int]) -> None:
        self._tokenizer = tokenizer
        self._added = dict(added)
        # One int object per id of the vocabulary, shared by every cached piece: the tokenizer
        # makes a new one per token, so that a cached prompt's ids would be thousands of
        # objects scattered over the heap, each touched when a request's list is built.
        # (Up to the largest id: a vocabulary's ids may leave holes; none where they are
        # mostly holes.)
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        top = max(ids, default=-1) + 1
        self._ints = tuple(range(top)) if top <= 2 * len(ids) + 1024 else None
        # Longest first: the alternation then matches as the tokenizer's leftmost-longest.
        alternatives = sorted(added, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(a) for a in alternatives))
        # Where every added token starts with the same character (most models: "<"), the
        # scan for them jumps from one such character to the next (str.find) and tries the
        # pattern only there: the matches finditer would give, without its step per character.
        firsts = {a[0] for a in alternatives}
        self._first = firsts.pop() if len(firsts) == 1 else None
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cached_tokens = 0
        self._recent: OrderedDict[str, _Recent] = OrderedDict()
        self._recent_tokens = 0
        self.cuts = _cuttable(tokenizer)
        self._words = WordCache.for_tokenizer(tokenizer, self._ints)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> SegmentCache | None:
        if tokenizer.normalizer is not None:
            return None
        if "Metaspace" in repr(tokenizer.pre_tokenizer):
            return None
        decoder = tokenizer.get_added_tokens_decoder()
        if not decoder:
            return None
        if any(t.lstrip or t.rstrip or t.single_word for t in decoder.values()):
            return None
        return cls(tokenizer, {t.content: i for i, t in decoder.items() if t.content})

    def encode(self, text: str, head: Sequence[int] = (), tail: Sequence[int] = ()) -> list[int]:
        """`text`'s ids (without special tokens), between `head` and `tail`."""
        out = _Parts([head], [], [])
        parts, todo = out.parts, out.todo
        start = 0
        for at, end, token_id in self._added_in(text):
            if at > start:
                self._piece(text[start:at], out)
            parts.append((token_id,))
            start = end
        if start < len(text):
            self._piece(text[start:], out)
        if todo and self._words is not None:
            todo = self._encode_plain(todo, parts)
        if todo:
            encoded = self._tokenizer.encode_batch_fast(
                [piece for _, piece in todo], add_special_tokens=False
            )
            for (at, piece), encoding in zip(todo, encoded, strict=True):
                found = encoding.ids
                parts[at] = new = tuple(map(self._ints.__getitem__, found) if self._ints else found)
                self._keep(piece, new)
        for piece, bounds, first in out.longs:
            spans = parts[first : first + len(bounds) - 1]
            self._remember(_Recent(piece, bounds, spans, sum(map(len, spans))))
        parts.append(tail)
        ids: list[int] = []
        for part in parts:  # += copies a tuple at once; chain would step id by id (3x the CPU)
            ids += part
        return ids

    def _encode_plain(
        self, todo: list[tuple[int, str]], parts: list[Sequence[int]]
    ) -> list[tuple[int, str]]:
        """The plain ASCII pieces of `todo` encoded word by word (`kit.lb.words`) into
        `parts`; the others are returned, for the tokenizer."""
        words = self._words
        assert words is not None
        rest = []
        for at, piece in todo:
            found = words.encode(piece) if plain(piece) else None
            if found is None:
                rest.append((at, piece))
                continue
            parts[at] = new = tuple(found)
            self._keep(piece, new)
        return rest

    def _added_in(self, text: str) -> Iterator[tuple[int, int, int]]:
        """(start, end, id) of each added token in `text`, left to right, as finditer finds
        them."""
        first = self._first
        if first is None:
            for found in self._pattern.finditer(text):
                yield found.start(), found.end(), self._added[found.group()]
            return
        match_at = self._pattern.match
        at = text.find(first)
        while at >= 0:
            match = match_at(text, at)
            if match is None:
                at = text.find(first, at + 1)
                continue
            end = match.end()
            yield at, end, self._added[match.group()]
            at = text.find(first, end)

    def _piece(self, piece: str, out: _Parts) -> None:
        """The piece's ids into `out.parts`, or its place (or its spans') into `out.todo`."""
        if self.cuts and len(piece) >= 2 * CUT_CHARS:
            self._spans(piece, out)
            return
        cached = self._cache.get(piece)
        if cached is not None:
            self._cache.move_to_end(piece)
            out.parts.append(cached)
        else:
            out.todo.append((len(out.parts), piece))
            out.parts.append(())

    def _spans(self, piece: str, out: _Parts) -> None:
        """A long piece, span by span between its cut points (a cut is a pre-token boundary:
        no token straddles it, so each span is encoded on its own). The last long piece seen
        with the same first `HEAD_CHARS` characters (`_recent`) gives the spans the two share
        (the same piece again, a system prompt: all of them, one comparison), found by
        comparing the texts up to its cuts (a cut depends only on the text up to it); the
        spans after those come from the cache, or are encoded."""
        parts, todo = out.parts, out.todo
        first = len(parts)
        start = 0
        bounds = [0]
        recent = self._recent.get(piece[:HEAD_CHARS])
        if recent is not None:
            self._recent.move_to_end(piece[:HEAD_CHARS])
            if recent.piece == piece:
                parts += recent.spans
                return
            shared = recent.shared_spans(piece)
            parts += recent.spans[:shared]
            bounds = recent.bounds[: shared + 1]
            start = bounds[-1]
        rest = cut_points(piece, start)
        for lo, hi in itertools.pairwise(rest):
            span = piece[lo:hi]
            cached = self._cache.get(span)
            if cached is None:
                todo.append((len(parts), span))
                parts.append(())
            else:
                self._cache.move_to_end(span)
                parts.append(cached)
        out.longs.append((piece, bounds + rest[1:], first))

    def _remember(self, recent: _Recent) -> None:
        head = recent.piece[:HEAD_CHARS]
        old = self._recent.pop(head, None)
        if old is not None:
            self._recent_tokens -= old.tokens
        self._recent[head] = recent
        self._recent_tokens += recent.tokens
        while self._recent_tokens > RECENT_TOKENS and self._recent:
            _, dropped = self._recent.popitem(last=False)
            self._recent_tokens -= dropped.tokens

    def _keep(self, piece: str, ids: tuple[int, ...]) -> None:
        if piece in self._cache:  # the same span twice in one text
            return
        self._cache[piece] = ids
        self._cached_tokens += len(ids)
        while self._cached_tokens > SEGMENT_CACHE_TOKENS and self._cache:
            _, dropped = self._cache.popitem(last=False)
            self._cached_tokens -= len(dropped)


@dataclass(frozen=True)
class _Parts:
    """One text's ids as they are put together: `parts` in order (ids known, or an empty place
    for a piece or span in `todo`: (its place, its text), encoded together at the end), and
    the long pieces to remember once they are (`longs`: the piece, its bounds, its first
    place)."""

    parts: list[Sequence[int]]
    todo: list[tuple[int, str]]
    longs: list[tuple[str, list[int], int]]


@dataclass(frozen=True)
class _Recent:
    """A long piece seen last with its first `HEAD_CHARS` characters: its bounds (0, its cuts,
    its length), each span's ids and their count."""

    piece: str
    bounds: list[int]
    spans: list[Sequence[int]]
    tokens: int

    def shared_spans(self, text: str) -> int:
        """How many of the piece's leading spans `text` has too: the most cuts up to which
        (the cut's space included) the two are the same, found by bisection."""
        lo, hi = 0, len(self.bounds) - 2  # the cuts are bounds[1:-1]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text.startswith(self.piece[: self.bounds[mid] + 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo


def cut_points(text: str, start: int = 0) -> list[int]:
    """`start` (0 or a cut), the cuts after it, len(text): a cut at the first space at least
    `CUT_CHARS` after the last cut whose previous character is a letter. Decided by the text
    before the cut and the cut itself, so that texts sharing a prefix share its cuts."""
    bounds = [start]
    at = start + CUT_CHARS
    while True:
        cut = text.find(" ", at)
        while cut > 0 and not text[cut - 1].isalpha():
            cut = text.find(" ", cut + 1)
        if cut <= 0:
            break
        bounds.append(cut)
        at = cut + CUT_CHARS
    bounds.append(len(text))
    return bounds


def _cuttable(tokenizer: Tokenizer) -> bool:
    """Whether a cut of `cut_points` is a pre-token boundary for this tokenizer: no
    normalizer, and a ByteLevel pre-tokenizer with GPT-2's regex, or a known Split regex
    (`_CUTTABLE_SPLITS`) before a ByteLevel without its own."""
    try:
        spec = json.loads(tokenizer.to_str())
    except ValueError:
        return False
    if spec.get("normalizer") is not None:
        return False
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        return pre.get("use_regex", True) is True
    if pre.get("type") != "Sequence":
        return False
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return False
    split, byte_level = steps
    return (
        split.get("type") == "Split"
        and (split.get("pattern") or {}).get("Regex") in _CUTTABLE_SPLITS
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
    )
