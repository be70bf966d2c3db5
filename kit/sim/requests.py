"""One generate request inside the worker: its input, and the state its sequence builds up.

`GenerateInput` is what the HTTP layer hands the engine (one per prompt and sample, after
batches and ``n`` are expanded). `RequestState` is the scheduler's sink for that sequence: it
picks the emulated tokens, applies stop strings and stop token ids, and wakes the HTTP handler
that streams or waits for the result.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kit.perf.scheduler import FinishReason, Sequence
from kit.sim import tokens


@dataclass
class GenerateInput:
    """One sequence to generate. Lengths are tokens."""

    rid: str
    prompt_ids: list[int]
    max_new_tokens: int | None  # None: up to the context (the scheduler caps it)
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    no_stop_trim: bool = False
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # First prompt position whose logprob is returned; -1 (SGLang's default) = none.
    logprob_start_len: int = -1
    sample_index: int = 0
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    routed_dp_rank: int | None = None
    health_check: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


class RequestState:
    """Implements `SequenceSink` for one `GenerateInput`; read by the HTTP layer."""

    def __init__(
        self, inp: GenerateInput, source: tokens.OutputSource, eos_after: int | None
    ) -> None:
        self.inp = inp
        self.source = source
        self.eos_after = eos_after
        self.output_ids: list[int] = []
        self._csv = ""
        self._csv_upto = 0
        self.text = ""
        self.finish: FinishReason | None = None
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.finished_at: float | None = None
        # When its first prefill chunk was scheduled (SGLang's forward_entry_time; monotonic).
        self.forward_entry_at: float | None = None
        self.token_times: list[float] = []
        self.num_retractions = 0
        self.dp_rank = 0
        # Decode: the first token the prefill sampled (id, logprob).
        self.prefill_first_token: int | None = None
        # Prompt tokens taken from a cache (SGLang's cached_tokens: the rank's radix cache,
        # kit.sim.prefix_cache, or HiCache's tiers, kit.sim.prefix), and from which tier
        # (cached_tokens_details: device, host, storage); the decode gets the prefill's.
        self.cached_tokens = 0
        self.cached_details: dict[str, Any] | None = None
        # A decode does not compute the prompt: its input logprobs come from the prefill.
        self.decode_side = False
        self._first: int | None = None
        self.changed = asyncio.Event()
        self.seq: Sequence | None = None
        # The engine's PD tasks for this request (bootstrap wait, KV send or receive).
        self.tasks: set[asyncio.Task[None]] = set()
        # Hooks the engine sets: KV computed (prefill), KV room reserved (decode), done.
        self.prefilled_hook: Any = None
        self.reserved_hook: Any = None
        self.finished_hook: Any = None

    # -- SequenceSink ----------------------------------------------------------------------

    def on_token(
        self, seq: Sequence, now: float, reason: FinishReason | None
    ) -> FinishReason | None:
        first = not self.output_ids
        if (
            reason is not None
            and reason.kind == "stop"
            and (first or self.inp.ignore_eos or len(self.output_ids) + 1 < self.inp.min_new_tokens)
        ):
            reason = None  # the emulated EOS is suppressed (ignore_eos, min_new_tokens)
        if first:
            # A decode takes the prefill's first token; drawing its own keeps the emulated
            # sequence the same as a colocated worker's.
            own = self.sample_first_token()
            token = self.prefill_first_token if self.prefill_first_token is not None else own
        elif reason is not None and reason.kind == "stop":
            # The scheduler's end of answer: the emulated model emits its EOS token.
            token = tokens.EOS_TOKEN_ID
            reason = FinishReason("stop", matched=token)
        else:
            token = self.source.next_token()
        self._append(token)
        if reason is None:
            reason = self._stop_match(token)
        self.changed.set()
        return reason

    def on_finish(self, seq: Sequence, reason: FinishReason, now: float) -> None:
        self.finish = reason
        self.finished_at = time.monotonic()
        self.num_retractions = seq.retractions
        self.changed.set()
        if self.finished_hook is not None:
            self.finished_hook(self)

    def on_prefilled(self, seq: Sequence, now: float) -> None:
        if self.prefilled_hook is not None:
            self.prefilled_hook(self)

    def on_reserved(self, seq: Sequence, now: float) -> None:
        if self.reserved_hook is not None:
            self.reserved_hook(self)

    # -- tokens ----------------------------------------------------------------------------

    def sample_first_token(self) -> int:
        """The first sampled token, drawn once (a prefill sends it to the decode)."""
        if self._first is None:
            self._first = self.source.next_token()
        return self._first

    def record_prefill_token(self) -> None:
        """Prefill mode: the response carries the one token the prefill sampled."""
        if not self.output_ids:
            self._append(self.sample_first_token())
            self.changed.set()

    def _append(self, token: int) -> None:
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        self.token_times.append(now)
        self.last_token_at = now
        self.output_ids.append(token)
        self.text += tokens.decode_token(token)

    @property
    def ids_csv(self) -> str:
        """The output ids as JSON array content, extended incrementally (stream chunks)."""
        if self._csv_upto < len(self.output_ids):
            fresh = ",".join(map(str, self.output_ids[self._csv_upto :]))
            self._csv = f"{self._csv},{fresh}" if self._csv else fresh
            self._csv_upto = len(self.output_ids)
        return self._csv

    def logprob_at(self, index: int) -> float:
        """The reported log-probability of output token `index`."""
        return tokens.token_logprob(self.inp.prompt_len + index, self.output_ids[index])

    @property
    def output_logprobs(self) -> list[float]:
        return [self.logprob_at(i) for i in range(len(self.output_ids))]

    def _stop_match(self, token: int) -> FinishReason | None:
        if len(self.output_ids) < self.inp.min_new_tokens:
            return None
        if token in self.inp.stop_token_ids:
            return FinishReason("stop", matched=token)
        for stop in self.inp.stop:
            if not stop:
                continue
            piece_start = max(0, len(self.text) - len(tokens.decode_token(token)) - len(stop))
            at = self.text.find(stop, piece_start)
            if at >= 0:
                if not self.inp.no_stop_trim:
                    self.text = self.text[:at]
                return FinishReason("stop", matched=stop)
        return None

    # -- results ---------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.finish is not None

    async def wait_change(self) -> None:
        """Return once the state changed since the last call (or is finished)."""
        if not self.done:
            await self.changed.wait()
        self.changed.clear()

    async def wait_done(self) -> None:
        while not self.done:
            await self.changed.wait()
            self.changed.clear()

    def fail(self, message: str, status_code: int) -> None:
        """Finish without the scheduler (e.g. before a sequence exists)."""
        if self.finish is None:
            self.finish = FinishReason("abort", message=message, status_code=status_code)
            self.finished_at = time.monotonic()
            self.changed.set()
            if self.finished_hook is not None:
                self.finished_hook(self)

    def e2e_latency(self) -> float:
        return (self.finished_at or time.monotonic()) - self.arrival

    def meta_info(self) -> dict[str, Any]:
        """SGLang's ``meta_info`` for the output so far."""
        finish = self.finish.to_json() if self.finish is not None else None
        meta: dict[str, Any] = {
            "id": self.inp.rid,
            "finish_reason": finish,
            "prompt_tokens": self.inp.prompt_len,
            "weight_version": "default",
            "num_retractions": self.num_retractions,
            "reasoning_tokens": 0,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
        }
        if self.cached_details is not None:
            meta["cached_tokens_details"] = self.cached_details
        if self.inp.return_logprob:
            meta.update(self.logprob_meta())
        if self.finish is not None:
            meta["e2e_latency"] = round(self.e2e_latency(), 6)
        return meta

    def logprob_meta(self) -> dict[str, Any]:
        # Prompt logprobs only from logprob_start_len on (SGLang: -1 = none), never on a PD
        # decode (the prefill has them; routers merge them).
        start = self.inp.logprob_start_len
        prompt = self.inp.prompt_ids
        positions = [] if self.decode_side or start < 0 else list(range(start, len(prompt)))
        inp = [
            [None if i == 0 else tokens.token_logprob(i, prompt[i]), prompt[i], None]
            for i in positions
        ]
        out = [[lp, t, None] for lp, t in zip(self.output_logprobs, self.output_ids, strict=True)]
        meta: dict[str, Any] = {
            "input_token_logprobs": inp,
            "output_token_logprobs": out,
            "output_token_logprobs_length": len(out),
        }
        k = self.inp.top_logprobs_num
        if k > 0:
            first = self.inp.prompt_len
            meta["output_top_logprobs"] = [
                [[lp, tid, None] for lp, tid in tokens.top_logprobs(first + i, t, k)]
                for i, t in enumerate(self.output_ids)
            ]
            meta["input_top_logprobs"] = [
                None
                if i == 0
                else [[lp, tid, None] for lp, tid in tokens.top_logprobs(i, prompt[i], k)]
                for i in positions
            ]
        return meta
