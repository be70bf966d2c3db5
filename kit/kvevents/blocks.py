"""SGLang 0.5.23's block hashes (`srt/mem_cache/utils.py`, `cpp_utils/hash_binding.cpp`).

A prompt is cut into pages of `block_size` tokens; page i's digest is
``SHA-256(digest of page i-1 || token ids of page i as little-endian uint32)`` (page 0 has no
prior digest when the request has neither LoRA nor cache salt), and the published block hash is
the first 8 bytes of that digest read big-endian as a signed 64-bit integer
(`hash_str_to_int64` of the hex digest). The radix cache stores only whole pages, so only whole
pages are hashed here.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def block_hashes(token_ids: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """The hashes of the whole pages of `token_ids` (at most `limit` pages), as SGLang
    publishes them in BlockStored.block_hashes."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    pages = len(token_ids) // block_size
    if limit is not None:
        pages = min(pages, limit)
    raw = array("I", token_ids[: pages * block_size])
    if raw.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte "I"
        raise RuntimeError("array('I') is not 32-bit here")
    data = raw.tobytes() if sys.byteorder == "little" else _le(raw)
    step = block_size * 4
    out: list[int] = []
    prior = b""
    for i in range(pages):
        prior = hashlib.sha256(prior + data[i * step : (i + 1) * step]).digest()
        out.append(_int64(prior))
    return out


def _le(raw: array[int]) -> bytes:  # pragma: no cover - big-endian hosts only
    swapped = array("I", raw)
    swapped.byteswap()
    return swapped.tobytes()
