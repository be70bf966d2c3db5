"""Text and tokens in the emulated model.

The one rule for prompts: **a text is ``ceil(UTF-8 bytes / 4)`` tokens** (at least 1), the
usual rule of thumb for English with BPE tokenizers. Token ids come from the bytes, 4 per
token, so the same text always gives the same ids. A chat request is first rendered with
`render_chat` (``<|role|>\\n{content}\\n`` per message, then ``<|assistant|>\\n``), then counted
by the same rule.

Outputs: the emulated model speaks words from `WORDS`, one word per token (``" word"``, id
``WORD_ID_BASE + index``). Which words, and when the model would end its answer with EOS, is
drawn from a generator seeded by (seed, prompt ids, sample index): deterministic for a seed,
different across prompts. Log-probabilities are a fixed function of (position, token id).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

# The tokenizer itself lives below the sim, where pdkit's router can use it too.
from kit.byte_tokenizer import BYTES_PER_TOKEN, WORD_ID_BASE, encode, render_chat

EOS_TOKEN_ID = 2

_WORD_LIST = """the of and to in is that it for on with as was at by be this from are or an have not
    they which one you were all we her she there would their has been if more when will who
    what so no out up into than them can only other new some could time these two may then do
    first any my now such like our over man me even most made after also did many before must
    through back years where much your way well down should because each just those people how
    too little state good very make world still own see men work long get here between both
    life being under never day same another know while last might us great old year off come
    since against go came right used take three states himself few house use during without
    again place around however home small found thought went say part once general high upon
    school every does got united left number course war until always away something fact
    though water less public put think almost hand enough far took head yet government system
    better set told nothing night end why called didn find going look asked later knew point
    next program city business give group toward young days let room president side social
    given present several order national possible rather second face per among form important
    often things looked early white case john become large big need four within felt along
    children saw best church ever least power development light thing seemed family interest
    want members mind country area others done turned although open god service certain kind
    problem began different door thus help sense means whole matter perhaps itself york times
    law human line above name example action company hands local show whether five history
    gave today either act feet across taken past quite anything seen having death experience
    body word half really week field car words already information tell together college shall
    money period held keep sure free seems real behind cannot miss political air question
    making office brought whose special major heard problems ago became federal"""
WORDS = tuple(_WORD_LIST.split())


def count_text_tokens(text: str) -> int:
    """Tokens in `text` by the rule above."""
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def decode_token(token_id: int) -> str:
    """Text of one output token ("" for EOS and ids outside the word list)."""
    index = token_id - WORD_ID_BASE
    return f" {WORDS[index]}" if 0 <= index < len(WORDS) else ""


def decode(token_ids: Sequence[int]) -> str:
    return "".join(decode_token(t) for t in token_ids)


def token_logprob(position: int, token_id: int) -> float:
    """Log-probability reported for `token_id` at `position`, in [-4, 0)."""
    mixed = (token_id * 2654435761 + position * 40503) % 4001
    return -round(mixed / 1000.0 + 0.001, 4)


def top_logprobs(position: int, token_id: int, k: int) -> list[tuple[float, int]]:
    """`k` (logprob, token id) alternatives, most likely first, the chosen token among them."""
    chosen = token_logprob(position, token_id)
    best = min(chosen, -0.0001 * (position % 7 + 1))
    alternatives = [(best, token_id)]
    for i in range(1, k):
        alt = WORD_ID_BASE + (token_id - WORD_ID_BASE + 7 * i) % len(WORDS)
        alternatives.append((round(best - 0.5 * i, 4), alt))
    return alternatives


class OutputSource:
    """The emulated model's choices for one (prompt, sample): next tokens and answer length."""

    def __init__(
        self, seed: int, prompt_ids: Sequence[int], sample: int = 0, kv_digest: int | None = None
    ) -> None:
        """`kv_digest`: the checksum of KV that arrived altered (PDKIT_SIM_FAULT=corrupt):
        the choices then follow that KV, not the prompt's, as a real model's would."""
        digest = hashlib.blake2b(
            b"".join(i.to_bytes(4, "little", signed=False) for i in prompt_ids), digest_size=16
        ).hexdigest()
        if kv_digest is not None:
            digest = f"{digest}:kv{kv_digest:x}"
        self._rng = random.Random(f"{seed}:{digest}:{sample}")
        self._length_rng = random.Random(f"{seed}:{digest}:{sample}:length")

    def next_token(self) -> int:
        return WORD_ID_BASE + self._rng.randrange(len(WORDS))

    def answer_length(self, mean_tokens: int) -> int | None:
        """Tokens before the model would emit EOS, or None when `mean_tokens` is 0."""
        if mean_tokens <= 0:
            return None
        low = max(1, mean_tokens // 2)
        return self._length_rng.randint(low, max(low, mean_tokens * 3 // 2))


__all__ = [
    "BYTES_PER_TOKEN",
    "EOS_TOKEN_ID",
    "WORDS",
    "WORD_ID_BASE",
    "OutputSource",
    "count_text_tokens",
    "decode",
    "decode_token",
    "encode",
    "render_chat",
    "token_logprob",
    "top_logprobs",
]
