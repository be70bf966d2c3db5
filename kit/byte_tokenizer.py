"""The emulated model's tokenizer (`kit.sim.tokens` documents the rule): pdkit's router uses it
to hash a sim deployment's prompts into the block hashes the sim publishes, as a router in front
of real SGLang would use the model's tokenizer."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

BYTES_PER_TOKEN = 4
WORD_ID_BASE = 1000


def encode(text: str, vocab: int) -> list[int]:
    """Token ids of `text`: each 4-byte group of its UTF-8 encoding, reduced into the
    vocabulary (ids below `WORD_ID_BASE` are left for special tokens)."""
    data = text.encode("utf-8") or b"\0"
    span = max(vocab - WORD_ID_BASE, 1)
    # A last group shorter than 4 bytes reads as if zero-padded (little-endian: the same
    # value), so the whole text is read as uint32s at once: 10x faster than a slice per token,
    # and the router encodes every prompt of a sim deployment.
    words = array("I", data + b"\0" * (-len(data) % BYTES_PER_TOKEN))
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        words.byteswap()
    return [WORD_ID_BASE + word % span for word in words]


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """The prompt text of a chat request (see the module doc). Non-text content parts
    (images, audio) are left out."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        out.append(f"<|{message.get('role', 'user')}|>\n{content or ''}\n")
    out.append("<|assistant|>\n")
    return "".join(out)
