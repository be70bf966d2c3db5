"""KV bytes over the Mooncake transfer engine (protocol tcp, metadata P2PHANDSHAKE).

Each PD worker owns one registered buffer laid out as its KV pool: page ``i`` of the pool is
``page_bytes`` long at ``base + i x page_bytes``. A request's KV is ``tokens x
bytes_per_token`` bytes (the model's KV bytes per token divided by ``PDKIT_SIM_KV_SCALE``)
written across its pages in order. The prefill fills its pages with bytes derived from the
bootstrap room, writes them into the decode's pages with ``batch_transfer_sync_write`` and
sends an Adler-32 checksum (SGLang's KV checksum is Adler-32 too); the decode recomputes it
over its own buffer before it decodes.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import mmap
import random
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kit.perf.kv_pages import page_runs

logger = logging.getLogger(__name__)

# Cap on one worker's registered buffer; a larger pool raises the effective scale instead.
MAX_BUFFER_BYTES = 512 * 1024**2

Extent = tuple[int, int]  # (address, length in bytes)


class TransferError(RuntimeError):
    """Mooncake could not start, register memory or write."""


def scaled_bytes_per_token(kv_bytes_per_token: float, scale: float, capacity_tokens: int) -> int:
    """Bytes per token actually moved: the real volume divided by `scale`, raised when the
    whole pool would not fit in `MAX_BUFFER_BYTES`; at least 1."""
    per_token = max(1, math.ceil(kv_bytes_per_token / scale))
    if capacity_tokens * per_token > MAX_BUFFER_BYTES:
        per_token = max(1, MAX_BUFFER_BYTES // max(capacity_tokens, 1))
    return per_token


def extents(base: int, page_bytes: int, page_ids: Sequence[int], length: int) -> list[Extent]:
    """Address ranges holding the first `length` bytes of a request stored in `page_ids`."""
    out: list[Extent] = []
    left = length
    for first, count in page_runs(page_ids):
        if left <= 0:
            break
        size = min(count * page_bytes, left)
        out.append((base + first * page_bytes, size))
        left -= size
    if left > 0:
        raise TransferError(f"{length} bytes do not fit in {len(page_ids)} pages")
    return out


def pair_extents(src: Sequence[Extent], dst: Sequence[Extent]) -> list[tuple[int, int, int]]:
    """Split two extent lists of the same total length into (src, dst, length) writes."""
    out: list[tuple[int, int, int]] = []
    i = j = 0
    s_off = d_off = 0
    while i < len(src) and j < len(dst):
        s_addr, s_len = src[i]
        d_addr, d_len = dst[j]
        n = min(s_len - s_off, d_len - d_off)
        out.append((s_addr + s_off, d_addr + d_off, n))
        s_off += n
        d_off += n
        if s_off == s_len:
            i, s_off = i + 1, 0
        if d_off == d_len:
            j, d_off = j + 1, 0
    if i != len(src) or j != len(dst):
        raise TransferError("source and destination KV extents differ in length")
    return out


def room_bytes(room: int, length: int) -> bytes:
    """The KV content the prefill produces for bootstrap room `room` (deterministic)."""
    return random.Random(room).randbytes(length)


@dataclass(frozen=True)
class WriteResult:
    bytes: int
    seconds: float


class KvBuffer:
    """One worker's registered KV buffer and its Mooncake engine."""

    def __init__(self, host_ip: str, pages: int, page_bytes: int, threads: int = 4) -> None:
        from mooncake.engine import TransferEngine  # noqa: PLC0415 - heavy native import

        self.page_bytes = page_bytes
        self.size = max(pages * page_bytes, 1)
        self._engine = TransferEngine()
        rc = self._engine.initialize(host_ip, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise TransferError(f"Mooncake initialize({host_ip!r}, P2PHANDSHAKE, tcp) -> {rc}")
        self.session = f"{host_ip}:{self._engine.get_rpc_port()}"
        self._map = mmap.mmap(-1, self.size)
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self.base = ctypes.addressof(self._anchor)
        rc = self._engine.register_memory(self.base, self.size)
        if rc != 0:
            raise TransferError(
                f"Mooncake register_memory of {self.size} bytes -> {rc}. To fix: raise the "
                "locked-memory limit (ulimit -l unlimited)"
            )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kv-write")
        self.bytes_written = 0
        logger.info(
            "sim: Mooncake session %s, %d-byte KV buffer registered", self.session, self.size
        )

    def extents(self, page_ids: Sequence[int], length: int) -> list[Extent]:
        return extents(self.base, self.page_bytes, page_ids, length)

    def fill(self, page_ids: Sequence[int], length: int, room: int) -> int:
        """Write the room's KV bytes into `page_ids`; return their Adler-32."""
        data = room_bytes(room, length)
        offset = 0
        for addr, size in self.extents(page_ids, length):
            start = addr - self.base
            self._map[start : start + size] = data[offset : offset + size]
            offset += size
        return zlib.adler32(data)

    def checksum(self, page_ids: Sequence[int], length: int) -> int:
        """Adler-32 of the first `length` bytes stored in `page_ids`."""
        value = 1
        for addr, size in self.extents(page_ids, length):
            start = addr - self.base
            value = zlib.adler32(self._map[start : start + size], value)
        return value

    def flip(self, page_ids: Sequence[int], length: int) -> None:
        """Invert the first byte stored in `page_ids` (PDKIT_SIM_FAULT=corrupt)."""
        if length <= 0:
            return
        addr, _ = self.extents(page_ids, length)[0]
        start = addr - self.base
        self._map[start] ^= 0xFF

    async def write(
        self, peer_session: str, src: Sequence[Extent], dst: Sequence[Extent]
    ) -> WriteResult:
        """Write `src` (local) into `dst` (the peer's registered buffer)."""
        writes = pair_extents(src, dst)
        total = sum(n for _, _, n in writes)

        def run() -> WriteResult:
            t0 = time.perf_counter()
            rc = self._engine.batch_transfer_sync_write(
                peer_session,
                [s for s, _, _ in writes],
                [d for _, d, _ in writes],
                [n for _, _, n in writes],
            )
            if rc != 0:
                raise TransferError(f"Mooncake write of {total} bytes to {peer_session} -> {rc}")
            return WriteResult(total, time.perf_counter() - t0)

        result = await asyncio.get_running_loop().run_in_executor(self._pool, run)
        self.bytes_written += result.bytes
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        try:
            self._engine.unregister_memory(self.base)
        except Exception:  # best effort at shutdown
            logger.debug("sim: unregister_memory failed", exc_info=True)
