"""Text and tokens in the emulated model.

Prompts are counted and encoded by `kit.byte_tokenizer` (a text is ``ceil(UTF-8 bytes / 4)``
tokens; a chat request is first rendered with `render_chat`), which lives below the sim so that
the bench and the router read the same rule without importing the emulator.

Outputs: the emulated model speaks words from `WORDS`, one word per token (``" word"``, id
``WORD_ID_BASE + index``). Which words, and when the model would end its answer with EOS, is
drawn from a generator seeded by (seed, prompt ids, sample index): deterministic for a seed,
different across prompts. Log-probabilities are a fixed function of (position, token id).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from kit.byte_tokenizer import (
    BYTES_PER_TOKEN,
    WORD_ID_BASE,
    WORDS,
    count_text_tokens,
    encode,
    render_chat,
)

EOS_TOKEN_ID = 2


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
