"""Virtual-time sweeps: serve a synthetic workload with the worker's own scheduler and timing
model on a `VirtualClock`, and measure latency, SLO attainment and goodput.

Deployments: colocated instances, prefill-only or decode-only instances (DistServe's Fig. 1
set-ups: a prefill that hands the KV off at once, a decode whose KV appears at once), and xPyD
PD clusters in which each request reserves KV room on its decode before its prefill runs and
the KV then takes the timing model's transfer time. Requests are dealt round-robin, as a
simple router would. Times are model seconds.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from kit.perf.clock import VirtualClock
from kit.perf.gpus import GpuSpec
from kit.perf.kvpool import KvPool
from kit.perf.models import ModelShape
from kit.perf.scheduler import FinishReason, Mode, Scheduler
from kit.perf.scheduler import Sequence as Seq
from kit.perf.timing import Efficiency, Parallelism, TimingModel, plan_memory

Kind = Literal["colocated", "prefill-only", "decode-only", "pd"]


@dataclass(frozen=True)
class Request:
    """One synthetic request: arrival (s), prompt and output lengths (tokens)."""

    arrival: float
    prompt_len: int
    output_len: int


def poisson_workload(
    rate: float, count: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[Request]:
    """`count` requests with exponential inter-arrival times at `rate` requests/s."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(Request(t, prompt_len, output_len))
    return out


@dataclass(frozen=True)
class InstanceConfig:
    """One SGLang instance: model, GPU type and the launch knobs the scheduler honours."""

    model: ModelShape
    gpu: GpuSpec
    tp: int = 1
    page_size: int = 16
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    mixed_chunk: bool = False
    reserved_decode_tokens: int = 512
    kv_dtype_bytes: float = 2.0
    efficiency: Efficiency = field(default_factory=Efficiency)

    def build_timing(self) -> TimingModel:
        return TimingModel(
            self.model,
            self.gpu,
            Parallelism(tp=self.tp, attn_tp=self.tp),
            self.kv_dtype_bytes,
            self.efficiency,
        )

    def build(self, mode: Mode, clock: VirtualClock) -> Scheduler:
        timing = self.build_timing()
        memory = plan_memory(
            timing,
            self.model.context_len,
            chunked_prefill_size=self.chunked_prefill_size,
            mem_fraction_static=self.mem_fraction_static,
            max_running_requests=self.max_running_requests,
        )
        if memory.capacity_tokens < self.page_size:
            raise ValueError(f"{self.model.name} does not fit on {self.tp} x {self.gpu.name}")
        return Scheduler(
            mode=mode,
            timing=timing,
            pool=KvPool(memory.capacity_tokens // self.page_size, self.page_size),
            clock=clock,
            max_running=memory.max_running_requests,
            chunk_size=memory.chunked_prefill_size,
            mixed_chunk=self.mixed_chunk,
            reserved_decode_tokens=self.reserved_decode_tokens,
        )


@dataclass
class Outcome:
    """What one request saw. `first_token` and `finish` are None when it failed."""

    request: Request
    first_token: float | None = None
    finish: float | None = None
    tokens: int = 0

    @property
    def ttft(self) -> float:
        return (
            (self.first_token - self.request.arrival)
            if self.first_token is not None
            else float("inf")
        )

    @property
    def tpot(self) -> float:
        if self.first_token is None or self.finish is None:
            return float("inf")
        return (self.finish - self.first_token) / (self.tokens - 1) if self.tokens > 1 else 0.0


class _Recorder:
    """A SequenceSink that records times; PD hooks are plugged in per deployment."""

    def __init__(self, outcome: Outcome, record_first: bool = True) -> None:
        self.outcome = outcome
        self.record_first = record_first
        self.prefilled: Callable[[Seq, float], None] = lambda seq, now: None
        self.reserved: Callable[[Seq, float], None] = lambda seq, now: None

    def on_token(self, seq: Seq, now: float, reason: FinishReason | None) -> FinishReason | None:
        if self.record_first and self.outcome.first_token is None:
            self.outcome.first_token = now
        self.outcome.tokens = seq.generated
        return reason

    def on_finish(self, seq: Seq, reason: FinishReason, now: float) -> None:
        if reason.kind != "abort" and self.record_first:
            self.outcome.finish = now

    def on_prefilled(self, seq: Seq, now: float) -> None:
        self.prefilled(seq, now)

    def on_reserved(self, seq: Seq, now: float) -> None:
        self.reserved(seq, now)


@dataclass
class Cluster:
    """A deployment on one virtual clock: `kind` and the instance counts say what runs."""

    kind: Kind
    config: InstanceConfig
    prefill: int = 1
    decode: int = 1
    rdma: bool = True
    clock: VirtualClock = field(default_factory=VirtualClock)

    @property
    def gpus(self) -> int:
        count = {"pd": self.prefill + self.decode, "decode-only": self.decode}.get(
            self.kind, self.prefill
        )
        return count * self.config.tp

    def run(self, workload: Sequence[Request]) -> list[Outcome]:
        """Serve `workload` to completion; one outcome per request, in arrival order."""
        clock = self.clock
        if self.kind == "colocated":
            p_scheds = [self.config.build(Mode.NULL, clock) for _ in range(self.prefill)]
            d_scheds: list[Scheduler] = []
        elif self.kind == "prefill-only":
            p_scheds = [self.config.build(Mode.PREFILL, clock) for _ in range(self.prefill)]
            d_scheds = []
        elif self.kind == "decode-only":
            p_scheds = []
            d_scheds = [self.config.build(Mode.DECODE, clock) for _ in range(self.decode)]
        else:
            p_scheds = [self.config.build(Mode.PREFILL, clock) for _ in range(self.prefill)]
            d_scheds = [self.config.build(Mode.DECODE, clock) for _ in range(self.decode)]
        p_cycle = itertools.cycle(p_scheds) if p_scheds else None
        d_cycle = itertools.cycle(d_scheds) if d_scheds else None
        outcomes = [Outcome(r) for r in workload]
        for i, (req, out) in enumerate(zip(workload, outcomes, strict=True)):
            p = next(p_cycle) if p_cycle else None
            d = next(d_cycle) if d_cycle else None
            clock.call_at(req.arrival, self._arrival(i, req, out, p, d))
        clock.run()
        return outcomes

    def _arrival(
        self, i: int, req: Request, out: Outcome, p: Scheduler | None, d: Scheduler | None
    ) -> Callable[[], None]:
        clock = self.clock

        def arrive() -> None:
            rid = str(i)
            if self.kind == "colocated" and p is not None:
                p.submit(Seq(rid, req.prompt_len, req.output_len, _Recorder(out)))
            elif self.kind == "prefill-only" and p is not None:
                sink = _Recorder(out)

                def handed_off(seq: Seq, now: float) -> None:
                    # Prefill-only: the first token is out when the prefill ends.
                    out.first_token = out.finish = now
                    out.tokens = 1
                    clock.call_at(now, lambda: p.transfer_done(seq))

                sink.prefilled = handed_off
                p.submit(Seq(rid, req.prompt_len, 1, sink))
            elif self.kind == "decode-only" and d is not None:
                sink = _Recorder(out)

                def landed(seq: Seq, now: float) -> None:
                    clock.call_at(now, lambda: d.kv_arrived(seq))

                sink.reserved = landed
                d.submit(Seq(rid, req.prompt_len, req.output_len, sink))
            elif p is not None and d is not None:
                self._pd_request(rid, req, out, p, d)

        return arrive

    def _pd_request(self, rid: str, req: Request, out: Outcome, p: Scheduler, d: Scheduler) -> None:
        clock = self.clock
        d_sink = _Recorder(out)
        d_seq = Seq(rid, req.prompt_len, req.output_len, d_sink)
        p_sink = _Recorder(Outcome(req), record_first=False)

        def prefilled(seq: Seq, now: float) -> None:
            delay = p.timing.kv_transfer_seconds(req.prompt_len, rdma=self.rdma)

            def landed() -> None:
                p.transfer_done(seq)
                d.kv_arrived(d_seq)

            clock.call_at(now + delay, landed)

        def reserved(seq: Seq, now: float) -> None:
            # The prefill leaves its bootstrap queue once the decode has sent its KV pages.
            clock.call_at(now, lambda: p.submit(Seq(rid, req.prompt_len, 1, p_sink)))

        p_sink.prefilled = prefilled
        d_sink.reserved = reserved
        d.submit(d_seq)


@dataclass(frozen=True)
class Slo:
    """Latency targets (s) and the share of requests that must meet them."""

    ttft: float = 0.4
    tpot: float = 0.04
    attainment: float = 0.9


@dataclass(frozen=True)
class Summary:
    """Latency percentiles (s) and SLO attainment (0..1) of one run."""

    rate: float
    p90_ttft: float
    p90_tpot: float
    attainment: float
    requests: int


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(kind: Kind, rate: float, outcomes: Sequence[Outcome], slo: Slo) -> Summary:
    """Attainment counts the SLOs that apply: TTFT only for a prefill-only instance, both
    otherwise. For a decode-only instance the TTFT is the wait for a decode slot (the KV is
    there at once), which is what bounds its rate once its KV room is full."""
    ttfts = [o.ttft for o in outcomes]
    tpots = [o.tpot for o in outcomes]

    def ok(o: Outcome) -> bool:
        if kind == "prefill-only":
            return o.ttft <= slo.ttft
        return o.ttft <= slo.ttft and o.tpot <= slo.tpot

    attained = sum(1 for o in outcomes if ok(o)) / len(outcomes) if outcomes else 0.0
    return Summary(rate, percentile(ttfts, 0.9), percentile(tpots, 0.9), attained, len(outcomes))


def run_rate(
    cluster: Cluster,
    rate: float,
    prompt_len: int,
    output_len: int,
    *,
    requests: int,
    slo: Slo,
    seed: int = 0,
) -> Summary:
    """Serve a Poisson workload at `rate` req/s on a fresh copy of `cluster`."""
    fresh = replace(cluster, clock=VirtualClock())
    workload = poisson_workload(rate, requests, prompt_len, output_len, seed)
    return summarize(cluster.kind, rate, fresh.run(workload), slo)


def goodput(
    cluster: Cluster,
    prompt_len: int,
    output_len: int,
    *,
    slo: Slo,
    requests: int = 1000,
    seed: int = 0,
    low: float = 0.05,
    high: float = 16.0,
    ceiling: float = 4096.0,
    tolerance: float = 0.02,
) -> float:
    """Highest request rate (req/s) whose SLO attainment stays >= `slo.attainment`, by
    bisection (0 when even `low` misses; `ceiling` when even that meets the SLO)."""

    def meets(rate: float) -> bool:
        summary = run_rate(
            cluster, rate, prompt_len, output_len, requests=requests, slo=slo, seed=seed
        )
        return summary.attainment >= slo.attainment

    if not meets(low):
        return 0.0
    while meets(high):
        if high >= ceiling:
            return ceiling
        low, high = high, high * 2
    while high - low > tolerance * low:
        mid = (low + high) / 2
        low, high = (mid, high) if meets(mid) else (low, mid)
    return low


def rate_grid(start: float, stop: float, count: int) -> list[float]:
    """`count` rates evenly spaced from `start` to `stop` (req/s), rounded to 0.01."""
    step = (stop - start) / max(count - 1, 1)
    return sorted({round(start + i * step, 2) for i in range(count)})


__all__ = [
    "Cluster",
    "InstanceConfig",
    "Outcome",
    "Request",
    "Slo",
    "Summary",
    "goodput",
    "percentile",
    "poisson_workload",
    "rate_grid",
    "run_rate",
    "summarize",
]
