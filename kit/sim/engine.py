"""The worker's engine: schedulers for its DP ranks, and each request's path through them.

SGLang splits this between the tokenizer manager and the schedulers; here one object owns
the ranks (`Scheduler` on a `RealClock`), dispatches requests to them, and runs the PD
hand-off around the scheduler. A request's life (`Engine.submit`):

1. It is checked as SGLang's scheduler checks it (a refusal ends it with a 400), its prompt
   cut to the context with ``--allow-auto-truncate``, and it is given a DP rank.
2. On a prefill, it waits for its decode's reservation (bootstrap queue, up to
   ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``), takes what is cached of its prompt
   (`kit.sim.caching`), is prefilled, then its KV is written into the decode's buffer over
   Mooncake, taking at least the timing model's transfer time; the answer goes to the
   decode's long poll and the request finishes with ``length 0``.
3. On a decode, it finds its prefill (``bootstrap_host``/``bootstrap_port``), waits for KV
   room (prealloc), asks the prefill for the KV, compares its checksum (a mismatch fails the
   request only with ``--disaggregation-enable-kv-checksum``, as in SGLang; without it the
   decode goes on from the altered KV, and its tokens differ), then decodes starting from the
   prefill's first token.
4. Without PD, it is prefilled and decoded on its rank, past the prefix its rank has cached.
5. A client that leaves aborts it (`abort`): its hand-off is cancelled and its KV freed; a
   decode's pages that a prefill may still be writing are held for `KV_QUARANTINE_S` first.

A ``bootstrap_host`` of 2.2.2.2 (SGLang's fake host, used by health checks) or the ``fake``
transfer backend skips the hand-off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kit.net import host_port
from kit.perf.clock import RealClock
from kit.perf.cluster import InstanceConfig
from kit.perf.gpus import GpuSpec, UnknownGpuError, gpu_spec
from kit.perf.models import ModelShape
from kit.perf.scheduler import FinishReason, Mode, Phase, Scheduler, Sequence, Step
from kit.sim import faults, tokens, trace
from kit.sim.admission import Limits, embedding_crash
from kit.sim.args import WorkerArgs
from kit.sim.bootstrap import Reservation, RoomError, RoomTable
from kit.sim.caching import Caching
from kit.sim.pd_client import PdError, PrefillDirectory
from kit.sim.prefix import PoolClient
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.settings import SimSettings
from kit.sim.transfer import KvBuffer, TransferError, scaled_bytes_per_token

logger = logging.getLogger(__name__)

FAKE_BOOTSTRAP_HOST = "2.2.2.2"
# How long an aborted decode request's KV pages stay out of use: a Mooncake write the prefill
# had already started finishes well within this (MC_TRANSFER_TIMEOUT is the hard bound).
KV_QUARANTINE_S = 5.0
GEN_THROUGHPUT_WINDOW_S = 5.0
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
HEALTH_CHECK_PREFIX = "HEALTH_CHECK"  # rid prefix of health probes (SGLang's)


@dataclass(frozen=True)
class TransferRecord:
    """One KV hand-off as a side saw it: times in ms, speed in GB/s, size in MB (emulated)."""

    side: str  # "prefill" (sender) or "decode" (receiver)
    dp_rank: int
    latency_ms: float
    speed_gb_s: float
    total_mb: float
    bootstrap_ms: float = 0.0
    alloc_ms: float = 0.0


class StartupError(RuntimeError):
    """The worker cannot start as configured; the message says how to fix it."""


@dataclass
class PdStats:
    """PD counters and the last KV transfer's figures."""

    bootstrap_failed: int = 0
    transfer_failed: int = 0
    bootstrap_queue: int = 0
    kv_transfers: int = 0
    kv_bytes_moved: int = 0  # scaled bytes that really crossed Mooncake
    kv_bytes_emulated: float = 0.0  # unscaled bytes the emulated GPUs would move
    last_latency_ms: float = 0.0
    last_speed_gb_s: float = 0.0
    checksum_ok: int = 0
    kv_corrupted: int = 0  # KV that arrived altered and was decoded from anyway (no check)


def _raise_fatal(what: str) -> None:
    raise RuntimeError(what)


def _gpu(name: str) -> GpuSpec:
    try:
        return gpu_spec(name)
    except UnknownGpuError as exc:
        raise StartupError(f"PDKIT_SIM_GPU: {exc}") from exc


class Engine:
    """All DP ranks of one worker process; see the module docstring."""

    def __init__(self, args: WorkerArgs, settings: SimSettings, clock: RealClock) -> None:
        self.args = args
        # A scheduler exception: the worker dies as SGLang's does; alone (tests) this raises.
        self.on_fatal: Callable[[str], None] = _raise_fatal
        self.settings = settings
        self.clock = clock
        self.mode = Mode(args.disaggregation_mode)
        self.launched = self.mode
        # The launch record from this worker's own argv and env, as the Plan carries it.
        launch = args.launch(settings.gpu, settings.speed)
        self.config = InstanceConfig.from_launch(launch, gpu=_gpu(settings.gpu))
        config = self.config
        self.model: ModelShape = config.model
        self.gpu: GpuSpec = config.gpu
        self.gpus = config.gpus
        self.timing = config.build_timing()
        self.context_len = config.context_len
        memory = config.memory(self.timing)
        self.chunk_size = memory.chunked_prefill_size
        self.mem_fraction = memory.mem_fraction_static
        capacity = memory.capacity_tokens
        if capacity < args.page_size:
            weights = self.timing.weight_bytes_per_gpu() / 1024**3
            raise StartupError(
                f"{self.model.name} needs {weights:.1f} GiB of weights per GPU on "
                f"{args.tp_size} x {self.gpu.name} (tp={args.tp_size}, pp={args.pp_size}); "
                f"{self.mem_fraction:.0%} of {self.gpu.memory_bytes / 1024**3:.0f} GiB leaves no "
                "room for KV cache. To fix: raise --tp-size or --mem-fraction-static"
            )
        self.capacity_tokens = capacity
        self.limits = Limits(
            context_len=self.context_len,
            vocab=self.model.vocab,
            kv_capacity=capacity,
            allow_auto_truncate=args.allow_auto_truncate,
            context_length_flag=args.context_length,
            dp_size=args.dp_size,
            enable_custom_logit_processor=args.enable_custom_logit_processor,
        )
        self.max_running = config.rank_slots(memory)
        self.pages_per_rank = capacity // args.page_size
        self.ranks = config.build(self.mode, clock, timing=self.timing, on_step=self._on_step)
        seed = settings.seed if settings.seed is not None else args.random_seed
        self.seed = seed or 0
        self.uses_mooncake = args.is_pd and args.disaggregation_transfer_backend != "fake"
        self.kv_bytes_per_token = scaled_bytes_per_token(
            self.timing.kv_bytes_per_token, settings.kv_scale, capacity * args.dp_size
        )
        self.kv: KvBuffer | None = None
        self.rooms = RoomTable()
        self.prefills = PrefillDirectory(
            bootstrap_timeout_s=settings.bootstrap_timeout_s,
            waiting_timeout_s=settings.waiting_timeout_s,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            heartbeat_max_failure=settings.heartbeat_max_failure,
        )
        self.pd = PdStats()
        self.steps = 0
        self._rr = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._throughput: deque[tuple[float, int]] = deque()
        self.transfer_observers: list[Callable[[TransferRecord], None]] = []
        self.caching = Caching(
            args,
            clock,
            self.timing,
            mode=self.mode,
            ranks=len(self.ranks),
            pages_per_rank=self.pages_per_rank,
            kv_bytes_per_token=self.kv_bytes_per_token,
            spawn=self._spawn,
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start_transfer_engine(self, host_ip: str) -> None:
        """Start Mooncake and register the KV buffer (PD workers only)."""
        if not self.uses_mooncake:
            return
        try:
            self.kv = KvBuffer(
                host_ip,
                self.pages_per_rank * len(self.ranks),
                self.args.page_size * self.kv_bytes_per_token,
                self.settings.transfer_threads,
            )
        except TransferError as exc:
            raise StartupError(str(exc)) from exc

    def start_kv_pool(self) -> None:
        """Join the KV pool (Mooncake Store) as HiCache's L3, giving it this worker's global
        segment scaled like the KV it stores (PDKIT_SIM_KV_SCALE); with
        --hicache-storage-backend mooncake only."""
        if self.caching.prefix_cache is None or self.args.hicache_storage_backend != "mooncake":
            return
        settings = self.settings.kv_pool
        if settings is None:
            raise StartupError(
                "--hicache-storage-backend mooncake needs MOONCAKE_MASTER (the Mooncake Store "
                "master's host:port), as SGLang's MooncakeStoreConfig.load_from_env does. To "
                "fix: set it, or give the topology a kv_pool: section"
            )
        scale = self.kv_bytes_per_token / self.timing.kv_bytes_per_token
        segment = max(int(settings.global_segment_bytes * scale), 1 << 20)
        try:
            self.caching.pool = PoolClient(
                settings, self.args.page_size * self.kv_bytes_per_token, segment
            )
        except (OSError, ImportError) as exc:
            raise StartupError(str(exc)) from exc
        logger.info(
            "HiCache L3: Mooncake Store at %s (%s), global segment %d bytes (scaled)",
            settings.master,
            settings.protocol,
            segment,
        )

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.prefills.close()
        if self.kv is not None:
            self.kv.close()
        self.caching.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], state: RequestState) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        state.tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(state.tasks.discard)

    def _on_step(self, rank: Scheduler, step: Step) -> None:
        """SGLang's batch log lines: every prefill batch, every 40th decode batch; and each
        request's forward entry and, on a prefill, its prefill_forward stage (kit.sim.trace)."""
        self.steps += 1
        for seq, n in step.prefill:
            state = seq.sink
            if not isinstance(state, RequestState):
                continue
            if seq.computed == n + state.cached_tokens:  # its first chunk ran in this step
                state.forward_entry_at = self.clock.wall(step.start)
            if self.mode is Mode.PREFILL and seq.computed >= seq.target:
                started = state.forward_entry_at or self.clock.wall(step.start)
                trace.stage(state, "prefill_forward", started, self.clock.wall(step.end))
        if step.prefill and not all(s.rid.startswith(HEALTH_CHECK_PREFIX) for s, _ in step.prefill):
            logger.info(
                "Prefill batch. #new-seq: %d, #new-token: %d, #running-req: %d, #queue-req: %d",
                len(step.prefill),
                sum(n for _, n in step.prefill),
                len(rank.running),
                rank.num_queued(),
            )
        elif step.decode and self.steps % DECODE_LOG_INTERVAL == 0:
            logger.info(
                "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
                "gen throughput (token/s): %.2f, #queue-req: %d",
                len(step.decode),
                rank.pool.used_pages * rank.pool.page_size,
                rank.pool.usage(),
                self.gen_throughput(),
                rank.num_queued(),
            )

    # -- requests --------------------------------------------------------------------------

    def submit(self, inp: GenerateInput) -> RequestState:
        """Start generating `inp`; the returned state fills in as tokens come. What SGLang's
        scheduler refuses (`handle_generate_request`) ends the state with a 400 abort."""
        kept, refusal = self.limits.admit_input(inp.prompt_len)
        if refusal is None and kept < inp.prompt_len:
            inp.prompt_ids = inp.prompt_ids[:kept]  # --allow-auto-truncate
        source = tokens.OutputSource(self.seed, inp.prompt_ids, inp.sample_index)
        eos_after = None if inp.ignore_eos else source.answer_length(self.settings.answer_tokens)
        state = RequestState(inp, source, eos_after)
        state.decode_side = self.mode is Mode.DECODE
        trace.received(state)
        if state.finished_hook is None:
            state.finished_hook = trace.finished
        if refusal is not None and not inp.health_check:
            state.fail(refusal, 400)
            return state
        crash = embedding_crash(inp.prompt_ids, self.model.vocab)
        if crash and self.mode is not Mode.DECODE and not inp.health_check:
            self.on_fatal(crash)  # a decode embeds only its own output
        if inp.return_logprob and inp.logprob_start_len > inp.prompt_len:
            state.fail(
                f"req.logprob_start_len={inp.logprob_start_len} is higher than the number of "
                f"input tokens len(req.origin_input_ids)={inp.prompt_len}. Please use a smaller "
                "logprob_start_len.",
                400,
            )
            return state
        if self.mode is not Mode.NULL and inp.bootstrap_room is None and not inp.health_check:
            state.fail(
                "Invalid request: Disaggregated request received without bootstrap room "
                f"id. req.rid={inp.rid!r}",
                400,
            )
            return state
        max_new = self.limits.cap_new_tokens(inp.max_new_tokens, inp.prompt_len)
        inp.min_new_tokens = min(inp.min_new_tokens, max_new)
        rank_index = self._pick_rank(inp)
        rank = self.ranks[rank_index]
        state.dp_rank = rank_index
        # A sequence always samples at least one token (max_new_tokens 0 still prefills).
        seq = Sequence(inp.rid, inp.prompt_len, max(max_new, 1), state, eos_after)
        if self.mode is Mode.PREFILL:
            seq.max_new_tokens = 1
        state.seq = seq
        fake = (
            inp.health_check or inp.bootstrap_host == FAKE_BOOTSTRAP_HOST or not self.uses_mooncake
        )
        if self.mode is Mode.NULL:
            self.caching.match_prefix(state, seq, rank_index, self.mode)
            rank.submit(seq)
        elif self.mode is Mode.PREFILL:
            self._spawn(self._prefill_flow(state, seq, rank_index, fake), state)
        else:
            self._spawn(self._decode_flow(state, seq, rank_index, fake), state)
        return state

    def abort(self, state: RequestState, message: str = "Aborted by the client") -> None:
        """Stop a request (client gone): cancel its PD hand-off and free its KV. A decode's
        pages that a prefill may still be writing are held for `KV_QUARANTINE_S` first."""
        seq = state.seq
        if seq is None or state.done:
            state.fail(message, 499)
            return
        for task in list(state.tasks):
            task.cancel()
        self._drop(state.dp_rank, seq, FinishReason("abort", message=message))
        if self.mode is Mode.PREFILL and state.inp.bootstrap_room is not None:
            self.rooms.abandon(state.inp.bootstrap_room)
        state.fail(message, 499)

    def _drop(self, rank_index: int, seq: Sequence, reason: FinishReason) -> None:
        """Abort `seq`; a decode's pages a prefill may still write into are quarantined."""
        rank = self.ranks[rank_index]
        if self.mode is Mode.DECODE and seq.phase is Phase.TRANSFER and self.uses_mooncake:
            held = rank.abort(seq, reason, hold_kv=True)
            asyncio.get_running_loop().call_later(KV_QUARANTINE_S, rank.free_pages, held)
        else:
            rank.abort(seq, reason)

    def _pick_rank(self, inp: GenerateInput) -> int:
        dp = len(self.ranks)
        if inp.routed_dp_rank is not None and 0 <= inp.routed_dp_rank < dp:
            return inp.routed_dp_rank
        if self.mode is Mode.PREFILL and inp.bootstrap_room is not None:
            return inp.bootstrap_room % dp  # follow_bootstrap_room
        return next(self._rr) % dp

    def _global_pages(self, rank_index: int, seq: Sequence) -> list[int]:
        offset = rank_index * self.pages_per_rank
        return [offset + p for p in seq.page_ids]

    # -- prefill side ----------------------------------------------------------------------

    async def _prefill_flow(
        self, state: RequestState, seq: Sequence, rank_index: int, fake: bool
    ) -> None:
        rank = self.ranks[rank_index]
        loop = asyncio.get_running_loop()
        if fake:

            def handed_off(st: RequestState) -> None:
                self.caching.cache_prompt(st, rank_index)
                st.record_prefill_token()
                loop.call_soon(rank.transfer_done, seq)

            state.prefilled_hook = handed_off
            self.caching.match_prefix(state, seq, rank_index, self.mode)
            await self.caching.load_prefix(state, seq)
            rank.submit(seq)
            return
        room = state.inp.bootstrap_room
        assert room is not None  # checked in submit
        self.pd.bootstrap_queue += 1
        waiting_since = time.monotonic()
        try:
            reservation = await self.rooms.wait(room, self.settings.bootstrap_timeout_s)
        except RoomError as exc:
            self.pd.bootstrap_failed += 1
            message = (
                f"Prefill bootstrap failed for request rank=0 req.rid={state.inp.rid!r} "
                f"req.bootstrap_room={room} with exception {exc}"
            )
            logger.error(message)
            state.fail(message, 500)
            return
        finally:
            self.pd.bootstrap_queue -= 1
        if state.done:
            self.rooms.release(room)
            return
        trace.stage(state, "prefill_bootstrap", waiting_since)

        def prefilled(st: RequestState) -> None:
            self.caching.cache_prompt(st, rank_index)
            self._spawn(self._send_kv(st, seq, rank_index, reservation), st)

        state.prefilled_hook = prefilled
        self.caching.match_prefix(state, seq, rank_index, self.mode)
        await self.caching.load_prefix(state, seq)
        rank.submit(seq)

    async def _send_kv(
        self, state: RequestState, seq: Sequence, rank_index: int, reservation: Reservation
    ) -> None:
        rank = self.ranks[rank_index]
        room = reservation.room
        loop = asyncio.get_running_loop()
        started_model, started_wall = self.clock.now(), loop.time()
        first = state.sample_first_token()
        length = seq.prompt_len * self.kv_bytes_per_token
        try:
            if self.kv is None:
                raise TransferError("no transfer engine")
            if reservation.cancelled:
                raise TransferError("the decode withdrew its reservation")
            if reservation.bytes_per_token != self.kv_bytes_per_token:
                raise TransferError(
                    f"KV layout mismatch: prefill moves {self.kv_bytes_per_token} bytes/token, "
                    f"decode expects {reservation.bytes_per_token}. To fix: run both roles with "
                    "the same model, --kv-cache-dtype and PDKIT_SIM_KV_SCALE"
                )
            pages = self._global_pages(rank_index, seq)
            checksum = self.kv.fill(pages, length, room)
            fault = self.settings.fault
            session = await faults.before_send(fault, self.kv, reservation, pages, length)
            try:
                written = await self.kv.write(
                    session, self.kv.extents(pages, length), reservation.extents
                )
            except TransferError as exc:  # SGLang's words (disaggregation/mooncake/conn.py)
                logger.error("Session %s failed.", session)
                raise TransferError(
                    f"KVTransferError(bootstrap_room={room}): Failed to send kv chunk of {room} "
                    f"to {reservation.decode}"
                ) from exc
            modeled = self.timing.kv_transfer_seconds(
                seq.prompt_len, rdma=self.args.disaggregation_transfer_backend == "mooncake"
            )
            wait = self.clock.wall(started_model + modeled) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            latency_s = max(modeled, (loop.time() - started_wall) * self.clock.speed)
            emulated = seq.prompt_len * self.timing.kv_bytes_per_token
            self.pd.kv_transfers += 1
            self.pd.kv_bytes_moved += written.bytes
            self.pd.kv_bytes_emulated += emulated
            self.pd.last_latency_ms = latency_s * 1000
            self.pd.last_speed_gb_s = emulated / latency_s / 1e9
            self._observe(
                TransferRecord(
                    "prefill",
                    rank_index,
                    self.pd.last_latency_ms,
                    self.pd.last_speed_gb_s,
                    emulated / 1e6,
                )
            )
            reservation.complete(
                {
                    "status": "ok",
                    "checksum": checksum,
                    # SGLang's prefill computes the digest only with the flag (its decode
                    # skips the check when the prefill sent none).
                    "checksum_sent": self.args.disaggregation_enable_kv_checksum,
                    "bytes": written.bytes,
                    "first_token_id": first,
                    "kv_tokens": seq.prompt_len,
                    "cached_tokens": state.cached_tokens,
                    "cached_tokens_details": state.cached_details,
                    "latency_ms": self.pd.last_latency_ms,
                }
            )
            trace.stage(state, "prefill_transfer_kv_cache", started_wall)
            state.record_prefill_token()
            rank.transfer_done(seq)
        except (TransferError, OSError) as exc:
            self.pd.transfer_failed += 1
            reservation.complete({"status": "failed", "message": str(exc)})
            message = (
                f"Prefill transfer failed for request rank=0 req.rid={seq.rid!r} "
                f"req.bootstrap_room={room} with exception {exc}"
            )
            logger.error(message)
            rank.transfer_done(seq, FinishReason("abort", status_code=500, message=message))
        finally:
            # Cancelled (the prefill request was aborted) or failed: never leave the decode
            # waiting for an answer.
            reservation.complete({"status": "failed", "message": "the prefill request ended"})
            self.rooms.release(room)

    # -- decode side -----------------------------------------------------------------------

    def _bootstrap_addr(self, inp: GenerateInput) -> str:
        port = inp.bootstrap_port or self.args.disaggregation_bootstrap_port
        return host_port(inp.bootstrap_host or "127.0.0.1", port)

    async def _decode_flow(
        self, state: RequestState, seq: Sequence, rank_index: int, fake: bool
    ) -> None:
        rank = self.ranks[rank_index]
        loop = asyncio.get_running_loop()
        if fake:
            state.reserved_hook = lambda st: loop.call_soon(rank.kv_arrived, seq)
            rank.submit(seq)
            return
        addr = self._bootstrap_addr(state.inp)
        prefix = (
            f"Decode handshake failed for request rank=0 decode_req.req.rid={seq.rid!r} "
            f"decode_req.req.bootstrap_room={state.inp.bootstrap_room}"
        )
        looked_up = time.monotonic()
        try:
            info = await self.prefills.prefill_info(addr)
        except PdError as exc:
            mismatch: str | None = str(exc)
        else:
            mismatch = self._layout_mismatch(info)
        if mismatch:
            self.pd.bootstrap_failed += 1
            logger.error("%s with exception %s", prefix, mismatch)
            state.fail(f"{prefix} with exception {mismatch}", 500)
            return
        if state.done:
            return

        submitted = time.monotonic()
        bootstrap_ms = (submitted - looked_up) * 1000
        trace.stage(state, "decode_bootstrap", looked_up, submitted)

        def reserved(st: RequestState) -> None:
            trace.stage(st, "decode_waiting", submitted)
            waits = (bootstrap_ms, (time.monotonic() - submitted) * 1000)
            self._spawn(self._receive_kv(st, seq, rank_index, addr, waits), st)

        state.reserved_hook = reserved
        rank.submit(seq)

    def _observe(self, record: TransferRecord) -> None:
        for observer in self.transfer_observers:
            observer(record)

    def _layout_mismatch(self, info: dict[str, Any]) -> str | None:
        # SGLang's checks and words (disaggregation/common/conn.py).
        page_size, kv_dtype = info.get("page_size"), info.get("kv_cache_dtype")
        if page_size is not None and page_size != self.args.page_size:
            return (
                f"Page size mismatch: prefill server has page_size={page_size}, but decode "
                f"server has page_size={self.args.page_size}. Both servers must use the same "
                "--page-size value."
            )
        if kv_dtype is not None and kv_dtype != self.args.kv_cache_dtype:
            return (
                f"KV cache dtype mismatch: prefill server has kv_cache_dtype={kv_dtype}, but "
                f"decode server has kv_cache_dtype={self.args.kv_cache_dtype}. Both servers "
                "must use the same --kv-cache-dtype value."
            )
        return None

    async def _receive_kv(
        self,
        state: RequestState,
        seq: Sequence,
        rank_index: int,
        addr: str,
        waits: tuple[float, float],
    ) -> None:
        """Reserve on the prefill, wait for the KV, verify it. `waits` are the bootstrap and
        allocation waits (ms) so far."""
        rank = self.ranks[rank_index]
        room = state.inp.bootstrap_room
        assert self.kv is not None and room is not None
        asked = time.monotonic()
        pages = self._global_pages(rank_index, seq)
        length = seq.prompt_len * self.kv_bytes_per_token
        reservation = {
            "room": room,
            "session": faults.advertised(self.settings.fault, self.kv.session),
            "extents": self.kv.extents(pages, length),
            "bytes_per_token": self.kv_bytes_per_token,
            "kv_tokens": seq.prompt_len,
            "decode": f"{self.args.host}:{self.args.port}",
        }
        fault = self.settings.fault
        try:
            await faults.before_fetch(fault, room, self.settings.waiting_timeout_s)
            answer = await self.prefills.fetch_kv(addr, room, reservation)
            faults.after_fetch(fault, self.kv, pages, length)
            got, expected = self.kv.checksum(pages, length), int(answer["checksum"])
        except PdError as exc:
            self.pd.transfer_failed += 1
            # SGLang's words: `{decode_req.req.rid=}` and its KVTransferError's str
            # (srt/disaggregation/decode.py:2864, common/conn.py:115).
            cause = str(exc)
            if not cause.startswith("KVTransferError("):
                cause = f"KVTransferError(bootstrap_room={room}): {cause}"
            message = (
                f"Decode transfer failed for request rank=0 decode_req.req.rid={seq.rid!r} "
                f"decode_req.req.bootstrap_room={room} with exception {cause}"
            )
            logger.error(message)
            self._drop(rank_index, seq, FinishReason("abort", status_code=500, message=message))
            return
        verify = self.args.disaggregation_enable_kv_checksum and bool(
            answer.get("checksum_sent", True)
        )
        if got != expected and verify:  # SGLang's line and abort (disaggregation/decode.py)
            self.pd.transfer_failed += 1
            logger.error(
                "KV checksum mismatch req=%s bootstrap_room=%d expected=%#x got=%#x",
                seq.rid,
                room,
                expected,
                got,
            )
            reason = FinishReason("abort", status_code=500, message="KV checksum mismatch")
            self._drop(rank_index, seq, reason)
            return
        if got != expected:
            # What SGLang does without --disaggregation-enable-kv-checksum: it decodes from
            # the KV it holds, so the answer is fluent and wrong, with no line and no error.
            self.pd.kv_corrupted += 1
            state.source = tokens.OutputSource(
                self.seed, state.inp.prompt_ids, state.inp.sample_index, kv_digest=got
            )
        else:
            self.pd.checksum_ok += 1
        self.pd.kv_transfers += 1
        self.pd.kv_bytes_moved += length
        self.pd.kv_bytes_emulated += seq.prompt_len * self.timing.kv_bytes_per_token
        self.pd.last_latency_ms = float(answer.get("latency_ms", 0.0))
        if self.pd.last_latency_ms > 0:
            self.pd.last_speed_gb_s = (
                seq.prompt_len * self.timing.kv_bytes_per_token / self.pd.last_latency_ms / 1e6
            )
        self._observe(
            TransferRecord(
                "decode",
                rank_index,
                self.pd.last_latency_ms,
                self.pd.last_speed_gb_s,
                seq.prompt_len * self.timing.kv_bytes_per_token / 1e6,
                *waits,
            )
        )
        state.prefill_first_token = int(answer["first_token_id"])
        # SGLang reports the prefill's cache hits on the decode (its L3 hits via metadata).
        state.cached_tokens = int(answer.get("cached_tokens") or 0)
        state.cached_details = answer.get("cached_tokens_details")
        trace.stage(state, "decode_transferred", asked)
        rank.kv_arrived(seq)

    # -- state -----------------------------------------------------------------------------

    def gen_throughput(self) -> float:
        """Generated tokens per wall second over the last few seconds."""
        now = time.monotonic()
        total = sum(r.stats.generated_tokens for r in self.ranks)
        self._throughput.append((now, total))
        while len(self._throughput) > 2 and now - self._throughput[0][0] > GEN_THROUGHPUT_WINDOW_S:
            self._throughput.popleft()
        t0, n0 = self._throughput[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0

    @property
    def idle(self) -> bool:
        return all(r.idle for r in self.ranks) and self.pd.bootstrap_queue == 0

    def switch_role(self, new_role: str) -> None:
        """Serve as `new_role` from now on (`kit.sim.role_switch` checks the instance is
        idle first): the KV pool and the launch values are kept, the role's schedulers are
        rebuilt, as SGLang rebuilds only its disaggregation structures."""
        self.mode = Mode(new_role)
        self.args = dataclasses.replace(self.args, disaggregation_mode=new_role)
        self.ranks = self.config.build(
            self.mode,
            self.clock,
            launched=self.launched,
            timing=self.timing,
            on_step=self._on_step,
        )
