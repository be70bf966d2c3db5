"""Continuous batching for one data-parallel rank, as SGLang's scheduler does it, timed by the
timing model and driven by a `Clock` (real or virtual time: the same code for both).

Per mode:

* ``null`` (colocated): waiting -> prefill (chunked by ``--chunked-prefill-size``) -> running
  (one token per decode step) -> finished. A step with new prefill work runs the prefill alone
  and stalls the decodes (SGLang's default), or carries the running decodes along with
  ``--enable-mixed-chunk``; either way every decoding request waits for the prefill compute.
* ``prefill``: waiting -> prefill -> inflight (KV held until the transfer to the decode ends;
  the owner calls `Scheduler.transfer_done`) -> finished with ``length 0``.
* ``decode``: prealloc (waits for KV room and a request slot) -> transfer (room reserved; the
  owner moves the KV and calls `Scheduler.kv_arrived`) -> running, starting with the prefill's
  first token -> finished. Requests that outgrow the pool are retracted and resumed later. A
  decode has ``max_running + extra_slots`` request slots (SGLang's DecodeReqToTokenPool:
  ``--disaggregation-decode-extra-slots``), shared by the transferring, ready and running
  requests; at most ``max_running`` run.

Admission follows SGLang: FCFS with head-of-line blocking, a KV reserve for the running
requests' future tokens (``new_token_ratio``) in colocated mode, and
``--num-reserved-decode-tokens`` per active request on a decode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from kit.perf.clock import Clock
from kit.perf.kv_pages import KvPages
from kit.perf.timing import StepShape, TimingModel

# SGLang's KV admission estimate (sglang/srt/environ.py: SGLANG_INIT_NEW_TOKEN_RATIO 0.7,
# min ratio factor 0.14, decay over 600 decode steps; schedule_policy.CLIP_MAX_NEW_TOKENS 4096).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
CLIP_MAX_NEW_TOKENS = 4096


class Mode(StrEnum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class Phase(StrEnum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    PREALLOC = "prealloc"
    TRANSFER = "transfer"
    READY = "ready"
    RUNNING = "running"
    RETRACTED = "retracted"
    INFLIGHT = "inflight"
    FINISHED = "finished"


@dataclass(frozen=True)
class FinishReason:
    """Why a sequence ended, in SGLang's ``meta_info.finish_reason`` terms."""

    kind: Literal["length", "stop", "abort"]
    length: int = 0
    matched: int | str | None = None
    message: str = ""
    status_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == "length":
            return {"type": "length", "length": self.length}
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        return {
            "type": "abort",
            "message": self.message,
            "status_code": self.status_code,
            "err_type": None,
        }


def _over_budget(input_len: int) -> FinishReason:
    """SGLang's 400 for a prompt (`input_len` tokens) that cannot fit even in an empty pool."""
    return FinishReason(
        "abort",
        message=f"Request prompt exceeds the KV memory budget: input_len={input_len}.",
        status_code=400,
    )


class SequenceSink(Protocol):
    """Where a sequence's events go; every `now` is model seconds."""

    def on_token(
        self, seq: Sequence, now: float, reason: FinishReason | None
    ) -> FinishReason | None:
        """A token was produced; return the reason to finish. A ``stop`` reason with no
        ``matched`` is the model's end of answer (`Sequence.eos_after`): the sink picks the
        end-of-sequence token and may set it as ``matched``, or suppress the stop."""

    def on_finish(self, seq: Sequence, reason: FinishReason, now: float) -> None: ...

    def on_prefilled(self, seq: Sequence, now: float) -> None:
        """Prefill mode: the KV is computed and ready to send."""

    def on_reserved(self, seq: Sequence, now: float) -> None:
        """Decode mode: KV room is reserved (`seq.page_ids`); fetch the KV now."""


@dataclass(eq=False)
class Sequence:
    """One request's state in a scheduler. Lengths are tokens."""

    rid: str
    prompt_len: int
    max_new_tokens: int
    sink: SequenceSink
    eos_after: int | None = None  # the model ends its answer after this many tokens
    phase: Phase = Phase.WAITING
    target: int = 0
    computed: int = 0
    generated: int = 0
    page_ids: list[int] = field(default_factory=list)
    retractions: int = 0
    # Called once, when a prefill batch first takes the sequence from the waiting queue: where
    # SGLang matches a prompt against its radix cache (get_new_batch_prefill), so a request
    # queued behind another with the same prefix finds it cached once that one is prefilled.
    on_admit: Callable[[Sequence], None] | None = None

    @property
    def kv_tokens(self) -> int:
        return self.prompt_len + self.generated


@dataclass
class Step:
    prefill: list[tuple[Sequence, int]]
    decode: list[Sequence]
    start: float
    end: float


@dataclass
class SchedulerStats:
    """Cumulative counters (tokens, requests, model seconds)."""

    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    retracted: int = 0


class Scheduler:
    """One DP rank's batching loop; see the module docstring."""

    def __init__(
        self,
        *,
        mode: Mode,
        timing: TimingModel,
        pool: KvPages,
        clock: Clock,
        max_running: int,
        chunk_size: int,
        extra_slots: int = 0,
        max_prefill_tokens: int = 16384,
        mixed_chunk: bool = False,
        reserved_decode_tokens: int = 512,
        on_step: Callable[[Scheduler, Step], None] | None = None,
    ) -> None:
        self.mode = mode
        self.timing = timing
        self.pool = pool
        self.clock = clock
        self.max_running = max_running
        self.extra_slots = extra_slots
        self.chunk_size = chunk_size
        self.max_prefill_tokens = max_prefill_tokens
        self.mixed_chunk = mixed_chunk
        self.reserved_decode_tokens = reserved_decode_tokens
        self.on_step = on_step
        self.waiting: deque[Sequence] = deque()
        self.prealloc: deque[Sequence] = deque()
        self.transfer: set[Sequence] = set()
        self.ready: deque[Sequence] = deque()
        self.retracted: deque[Sequence] = deque()
        # The running batch in joining order (a dict as an ordered set: O(1) removal); the
        # newest is retracted first.
        self.running: dict[Sequence, None] = {}
        self.inflight: set[Sequence] = set()
        self.chunked: Sequence | None = None
        self.current: Step | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.stats = SchedulerStats()
        self._planning = False

    # -- public API ------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue a new sequence (prealloc on a decode, waiting otherwise)."""
        seq.target = seq.prompt_len
        if self.mode is Mode.DECODE:
            seq.phase = Phase.PREALLOC
            self.prealloc.append(seq)
        else:
            seq.phase = Phase.WAITING
            self.waiting.append(seq)
        self._kick(self.clock.now())

    def kv_arrived(self, seq: Sequence) -> None:
        """Decode mode: the prefill's KV for `seq` is in its pages; decode it."""
        if seq.phase is not Phase.TRANSFER:
            return
        self.transfer.discard(seq)
        seq.computed = seq.prompt_len
        seq.phase = Phase.READY
        self.ready.append(seq)
        self._kick(self.clock.now())

    def transfer_done(self, seq: Sequence, error: FinishReason | None = None) -> None:
        """Prefill mode: the KV left (or failed to); release it and finish the sequence."""
        if seq.phase is not Phase.INFLIGHT:
            return
        self.inflight.discard(seq)
        self._release(seq)
        if error is None:
            seq.generated = 1
        self._finish(seq, error or FinishReason("length", length=0), self.clock.now())
        self._kick(self.clock.now())

    def abort(self, seq: Sequence, reason: FinishReason, hold_kv: bool = False) -> list[int]:
        """Drop `seq` wherever it is; its sink gets `reason`. With `hold_kv` its pages stay
        allocated and are returned: the caller frees them (`free_pages`) once no transfer
        can still write into them."""
        if seq.phase is Phase.FINISHED:
            return []
        for queue in (self.waiting, self.prealloc, self.ready, self.retracted):
            if seq in queue:
                queue.remove(seq)
        self.transfer.discard(seq)
        self.inflight.discard(seq)
        self._leave(seq)
        if self.chunked is seq:
            self.chunked = None
        held: list[int] = []
        if hold_kv:
            held, seq.page_ids = seq.page_ids, []
        self._release(seq)
        self._finish(seq, reason, self.clock.now())
        self._kick(self.clock.now())
        return held

    def free_pages(self, page_ids: list[int]) -> None:
        """Return pages held back by `abort(..., hold_kv=True)`."""
        self.pool.free(page_ids)
        self._kick(self.clock.now())

    @property
    def idle(self) -> bool:
        return self.current is None and not (
            self.waiting
            or self.prealloc
            or self.transfer
            or self.ready
            or self.retracted
            or self.running
            or self.inflight
            or self.chunked
        )

    def num_running(self) -> int:
        """Requests in the running batch (plus the prefills of the current step)."""
        extra = len(self.current.prefill) if self.current else 0
        return len(self.running) + extra

    def num_queued(self) -> int:
        """Requests waiting for a forward step."""
        if self.mode is Mode.DECODE:
            return len(self.ready) + len(self.retracted)
        return len(self.waiting)

    # -- the loop --------------------------------------------------------------------------

    def _kick(self, start: float) -> None:
        if self.current is not None or self._planning:
            return
        self._planning = True
        try:
            step = self._plan(start)
        finally:
            self._planning = False
        if step is None:
            return
        self.current = step
        self.clock.call_at(step.end, lambda: self._complete(step))

    def _plan(self, start: float) -> Step | None:
        if self.mode is Mode.DECODE:
            self._admit_decode(start)
            self._join_ready(start)
        prefill = self._plan_prefill() if self.mode is not Mode.DECODE else []
        decode: list[Sequence] = []
        if self.running and (not prefill or self.mixed_chunk):
            decode = self._prepare_decode(start)
        if not prefill and not decode:
            return None
        completing = sum(1 for seq, n in prefill if seq.computed + n >= seq.target)
        shape = StepShape(
            prefill=tuple((n, seq.computed) for seq, n in prefill),
            decode_reqs=len(decode),
            decode_context=self._decode_context(decode),
            sampled=len(decode) + completing,
        )
        return Step(prefill, decode, start, start + self.timing.step_seconds(shape))

    def _complete(self, step: Step) -> None:
        now = step.end
        self.current = None
        self.stats.steps += 1
        self.stats.busy_s += step.end - step.start
        if step.decode:
            self._advance()
        for seq, n in step.prefill:
            if seq.phase is not Phase.PREFILLING:
                continue
            seq.computed += n
            self.stats.prompt_tokens += n
            if seq.computed < seq.target:
                continue
            if self.mode is Mode.PREFILL:
                seq.phase = Phase.INFLIGHT
                self.inflight.add(seq)
                seq.sink.on_prefilled(seq, now)
            else:
                seq.phase = Phase.RUNNING
                if not self._emit(seq, now):
                    self._join(seq)
        if step.decode:
            self._emit_decoded(step.decode, now)
            self.new_token_ratio = max(
                MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
            )
        if self.on_step is not None:
            self.on_step(self, step)
        self._kick(now)

    def _emit(self, seq: Sequence, now: float) -> bool:
        """Count one new token of `seq`; finish it if done. True when finished."""
        seq.generated += 1
        self.stats.generated_tokens += 1
        return self._heard(seq, now)

    def _heard(self, seq: Sequence, now: float) -> bool:
        """Tell `seq`'s sink of its latest token (`seq.generated`); finish it if done. True
        when finished."""
        reason: FinishReason | None = None
        if seq.generated >= seq.max_new_tokens:
            reason = FinishReason("length", length=seq.max_new_tokens)
        elif seq.eos_after is not None and seq.generated >= seq.eos_after:
            # The model ends its answer here; the sink names the end-of-sequence token.
            reason = FinishReason("stop")
        reason = seq.sink.on_token(seq, now, reason)
        if reason is None:
            return False
        self._leave(seq)
        self._release(seq)
        self._finish(seq, reason, now)
        return True

    # -- the running batch (hooks a subclass may keep its own books in) -------------------

    def _join(self, seq: Sequence) -> None:
        """Add `seq` (phase RUNNING, its KV in `seq.page_ids`) at the end of the batch."""
        self.running[seq] = None

    def _leave(self, seq: Sequence) -> None:
        """Take `seq` out of the batch, if it is in it."""
        self.running.pop(seq, None)

    def _advance(self) -> None:
        """A decode step completed: the batch it ran holds one more token each (before
        any sequence's sink hears of it)."""

    def _emit_decoded(self, decode: list[Sequence], now: float) -> None:
        """Emit the token each sequence of a completed decode step made."""
        for seq in decode:
            if seq.phase is Phase.RUNNING:
                self._emit(seq, now)

    def _decode_context(self, decode: list[Sequence]) -> int:
        """Tokens in the KV of the sequences of a decode step."""
        return sum(seq.kv_tokens for seq in decode)

    def _running_future(self) -> int:
        """KV tokens reserved for the running sequences' future tokens (`_future_tokens`)."""
        return sum(self._future_tokens(s) for s in self.running)

    def _finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        seq.phase = Phase.FINISHED
        if reason.kind == "abort":
            self.stats.aborted += 1
        else:
            self.stats.finished += 1
        seq.sink.on_finish(seq, reason, now)

    def _release(self, seq: Sequence) -> None:
        if seq.page_ids:
            self.pool.free(seq.page_ids)
            seq.page_ids = []

    # -- prefill ---------------------------------------------------------------------------

    def _future_tokens(self, seq: Sequence) -> int:
        if self.mode is not Mode.NULL:
            return 0
        left = min(seq.max_new_tokens - seq.generated, CLIP_MAX_NEW_TOKENS)
        return int(left * self.new_token_ratio)

    def _plan_prefill(self) -> list[tuple[Sequence, int]]:
        chunking = self.chunk_size > 0
        budget = (
            min(self.chunk_size, self.max_prefill_tokens) if chunking else self.max_prefill_tokens
        )
        parts: list[tuple[Sequence, int]] = []
        if self.chunked is not None:
            seq = self.chunked
            take = min(seq.target - seq.computed, budget)
            parts.append((seq, take))
            budget -= take
            if seq.computed + take < seq.target:
                return parts
            self.chunked = None
        slots = self.max_running - len(self.running) - len(self.inflight) - len(parts)
        if not (self.waiting and budget > 0 and slots > 0):
            return parts
        room = self.pool.free_tokens - self._running_future()
        while self.waiting and budget > 0 and slots > 0:
            seq = self.waiting[0]
            need = self.pool.pages_for(seq.target)
            future = self._future_tokens(seq)
            if need * self.pool.page_size + future > room:
                if self._hopeless(seq, parts):
                    self.waiting.popleft()
                    self._finish(seq, _over_budget(seq.target), self.clock.now())
                    continue
                break
            if not self._assign(seq, need):
                break
            self.waiting.popleft()
            seq.phase = Phase.PREFILLING
            if seq.on_admit is not None:
                admit, seq.on_admit = seq.on_admit, None
                admit(seq)
            room -= need * self.pool.page_size + future
            left = seq.target - seq.computed
            take = left if not chunking and not parts else min(left, budget)
            if take <= 0:
                self.waiting.appendleft(seq)
                break
            parts.append((seq, take))
            budget -= take
            slots -= 1
            if take < left:
                self.chunked = seq
                break
        return parts

    def _hopeless(self, seq: Sequence, parts: list[tuple[Sequence, int]]) -> bool:
        """True when `seq` cannot fit even in an empty pool."""
        return (
            not parts
            and not self.running
            and not self.inflight
            and self.pool.pages_for(seq.target) > self.pool.total_pages
        )

    # -- decode ----------------------------------------------------------------------------

    def _prepare_decode(self, now: float) -> list[Sequence]:
        """Give every running sequence room for its next token, retracting the newest ones
        when the pool runs out (SGLang's retract_decode)."""
        for seq in list(self.running):
            if seq.phase is Phase.RUNNING:
                self._grow(seq, seq.kv_tokens, now)
        return list(self.running)

    def _grow(self, seq: Sequence, kv_tokens: int, now: float) -> None:
        """Give running `seq` the pages `kv_tokens` tokens need, retracting the newest
        sequences (`seq` too, or aborting it when it is alone) while the pool is short."""
        need = self.pool.pages_for(kv_tokens) - self._held(seq)
        while need > 0:
            if self._take(seq, need):
                break
            victim = next(reversed(self.running))
            if victim is seq and len(self.running) == 1:
                self._leave(seq)
                self._release(seq)
                self._finish(
                    seq,
                    FinishReason(
                        "abort",
                        message="Out of KV memory while decoding a single request.",
                        status_code=503,
                    ),
                    now,
                )
                break
            self._retract(victim)
            if victim is seq:
                break

    def _assign(self, seq: Sequence, count: int) -> bool:
        """Give `seq`, which holds none, `count` pages; False (and nothing) when fewer are
        free."""
        page_ids = self.pool.alloc(count)
        if page_ids is None:
            return False
        seq.page_ids = page_ids
        return True

    def _held(self, seq: Sequence) -> int:
        """KV pages running `seq` holds."""
        return len(seq.page_ids)

    def _take(self, seq: Sequence, count: int) -> bool:
        """Give running `seq` `count` more pages; False (and nothing) when fewer are free."""
        page_ids = self.pool.alloc(count)
        if page_ids is None:
            return False
        seq.page_ids.extend(page_ids)
        return True

    def _retract(self, seq: Sequence) -> None:
        self._leave(seq)
        self._release(seq)
        seq.retractions += 1
        self.stats.retracted += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        if self.mode is Mode.DECODE:
            seq.phase = Phase.RETRACTED
            self.retracted.append(seq)
        else:
            # Recomputed from scratch later: the prompt plus what it generated so far.
            seq.phase = Phase.WAITING
            seq.computed = 0
            seq.target = seq.kv_tokens
            self.waiting.appendleft(seq)

    def _active(self) -> int:
        return len(self.running) + len(self.transfer) + len(self.ready)

    def _admit_decode(self, now: float) -> None:
        """Resume retracted sequences, then reserve KV room for preallocating ones."""
        page = self.pool.page_size
        while self.retracted:
            seq = self.retracted[0]
            reserve = self.reserved_decode_tokens * (self._active() + 1)
            need = self.pool.pages_for(seq.kv_tokens)
            if need * page > self.pool.free_tokens - reserve:
                break
            if not self._assign(seq, need):
                break
            self.retracted.popleft()
            seq.phase = Phase.RUNNING
            self._join(seq)
        if self.retracted:
            return
        while self.prealloc and self._active() < self.max_running + self.extra_slots:
            seq = self.prealloc[0]
            reserve = self.reserved_decode_tokens * (self._active() + 1)
            need = self.pool.pages_for(seq.prompt_len)
            if need * page > self.pool.free_tokens - reserve:
                if need > self.pool.total_pages:
                    self.prealloc.popleft()
                    self._finish(seq, _over_budget(seq.prompt_len), now)
                    continue
                break
            if not self._assign(seq, need):
                break
            self.prealloc.popleft()
            seq.phase = Phase.TRANSFER
            self.transfer.add(seq)
            seq.sink.on_reserved(seq, now)

    def _join_ready(self, now: float) -> None:
        """Move sequences whose KV arrived into the running batch; each starts with the
        first token the prefill sampled (SGLang's prebuilt extend, no GPU work)."""
        while self.ready and len(self.running) < self.max_running:
            seq = self.ready.popleft()
            seq.phase = Phase.RUNNING
            if not self._emit(seq, now):
                self._join(seq)
