"""SGLang 0.5.23's block hashes (`srt/mem_cache/utils.py`, `cpp_utils/hash_binding.cpp`).

A prompt is cut into pages of `block_size` tokens; page i's digest is
``SHA-256(digest of page i-1 || token ids of page i as little-endian uint32)`` (page 0 has no
prior digest when the request has neither LoRA nor cache salt), and the published block hash is
the first 8 bytes of that digest read big-endian as a signed 64-bit integer
(`hash_str_to_int64` of the hex digest). The radix cache stores only whole pages, so only whole
pages are hashed here.

`BlockHasher` gives the same hashes and remembers those of recurring chunks of a prompt (a
shared system prompt, a shared document, earlier turns of a chat): at SGLang's CPU page size
of one token, a 4,000-token prompt is 4,000 SHA-256 calls (about 3 ms of Python), and a
chunk seen before costs one dictionary look-up instead.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence

CHUNK_TOKENS = 256
"""Tokens per remembered chunk (whole pages: at least one page per chunk)."""

MAX_CHUNKS = 2048
"""Chunks `BlockHasher` remembers at most (about 3 KiB each at page size 1: some 6 MiB, 512k
tokens of distinct prefixes); the least recently used go first."""


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def _page_bytes(token_ids: Sequence[int], tokens: int) -> bytes:
    raw = array("I", token_ids[:tokens])
    if raw.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte "I"
        raise RuntimeError("array('I') is not 32-bit here")
    return raw.tobytes() if sys.byteorder == "little" else _le(raw)


def _pages(token_ids: Sequence[int], block_size: int, limit: int | None) -> int:
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    pages = len(token_ids) // block_size
    return pages if limit is None else min(pages, limit)


def _chain(prior: bytes, data: bytes, step: int) -> tuple[array[int], bytes]:
    """The block hashes of the whole pages in `data` (`step` bytes each) after the digest
    `prior`, and the last page's digest."""
    sha = hashlib.sha256
    heads: list[bytes] = []
    keep = heads.append
    view = memoryview(data)
    for offset in range(0, len(data), step):
        prior = sha(prior + view[offset : offset + step]).digest()
        keep(prior[:8])
    out = array("q", b"".join(heads))
    if sys.byteorder == "little":
        out.byteswap()  # the first 8 bytes read big-endian
    return out, prior


def block_hashes(token_ids: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """The hashes of the whole pages of `token_ids` (at most `limit` pages), as SGLang
    publishes them in BlockStored.block_hashes."""
    pages = _pages(token_ids, block_size, limit)
    data = _page_bytes(token_ids, pages * block_size)
    return list(_chain(b"", data, block_size * 4)[0])


class BlockHasher:
    """`block_hashes`, with the hashes of each aligned chunk of `CHUNK_TOKENS` tokens kept by
    (block size, the digest before it, its bytes), so that a prefix seen before is not hashed
    again. A chunk's digests depend on everything before it only through the prior digest,
    which is in the key: a hit is exact."""

    def __init__(self, chunk_tokens: int = CHUNK_TOKENS, max_chunks: int = MAX_CHUNKS) -> None:
        self.chunk_tokens = chunk_tokens
        self.max_chunks = max_chunks
        self._chunks: OrderedDict[tuple[int, bytes, bytes], tuple[array[int], bytes]] = (
            OrderedDict()
        )
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """Chunks remembered."""
        return len(self._chunks)

    def __call__(
        self, token_ids: Sequence[int], block_size: int, limit: int | None = None
    ) -> list[int]:
        pages = _pages(token_ids, block_size, limit)
        data = _page_bytes(token_ids, pages * block_size)
        step = block_size * 4
        chunk = max(1, self.chunk_tokens // block_size) * step
        whole = len(data) - len(data) % chunk
        chunks = self._chunks
        out: list[int] = []
        prior = b""
        for start in range(0, whole, chunk):
            key = (block_size, prior, data[start : start + chunk])
            known = chunks.get(key)
            if known is None:
                self.misses += 1
                known = chunks[key] = _chain(prior, key[2], step)
                if len(chunks) > self.max_chunks:
                    chunks.popitem(last=False)
            else:
                self.hits += 1
                chunks.move_to_end(key)
            out += known[0]
            prior = known[1]
        if whole < len(data):
            out += _chain(prior, data[whole:], step)[0]
        return out


def _le(raw: array[int]) -> bytes:  # pragma: no cover - big-endian hosts only
    swapped = array("I", raw)
    swapped.byteswap()
    return swapped.tobytes()
