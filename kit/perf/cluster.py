"""Deployments in virtual time: SGLang instances, each the worker's own scheduler and timing
model, on one `VirtualClock`, serving a list of requests to completion.

Deployments: colocated instances; prefill-only or decode-only instances (DistServe's Fig. 1
set-ups: a prefill that hands the KV off at once, a decode whose KV appears at once); and xPyD
PD clusters, whose prefill and decode instances may be launched differently (TP and DP per
role), in which each request reserves KV room on its decode before its prefill runs and the KV
then takes the timing model's transfer time. Requests are dealt round-robin over the DP ranks
of all instances, as a simple router would. Times are model seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from kit.perf.clock import Clock, VirtualClock
from kit.perf.counting import CountingScheduler
from kit.perf.gpus import DEFAULT_GPU, GpuSpec, gpu_spec
from kit.perf.kv_pages import KvPages
from kit.perf.models import ModelShape, resolve_model
from kit.perf.scheduler import FinishReason, Mode, Scheduler, Step
from kit.perf.scheduler import Sequence as Seq
from kit.perf.timing import Efficiency, MemoryPlan, TimingModel, kv_dtype_bytes, plan_memory
from kit.perf.workload import Request
from kit.topology.launch import Parallelism, WorkerLaunch

Kind = Literal["colocated", "prefill-only", "decode-only", "pd"]

# SGLang 0.5.23's defaults where a launch does not set these.
DEFAULT_PAGE_SIZE = 1
DEFAULT_MAX_PREFILL_TOKENS = 16384
DEFAULT_RESERVED_DECODE_TOKENS = 512


@dataclass(frozen=True)
class InstanceConfig:
    """One SGLang instance: model, GPU type and the launch knobs the scheduler honours (None:
    SGLang's default). `kv_dtype_bytes` is bytes per KV element (2: bf16, 1: fp8). Build it
    from a launch record with `from_launch` (the Plan's, sizing's candidates', the sim's).

    `dp` schedulers (DP ranks) serve the instance, as the sim worker runs them: with
    `dp_attention` they share the `tp` GPUs (attention TP tp/dp, request slots split between
    them), without it each rank has `tp` GPUs of its own. `ep` (expert parallel) shards the
    experts over the same GPUs as TP does, which the timing model prices alike; `pp` stages
    split the layers."""

    model: ModelShape
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    ep: int = 1
    pp: int = 1
    gpus_per_node: int = 8
    page_size: int = 16
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS
    context_length: int | None = None
    mixed_chunk: bool = False
    reserved_decode_tokens: int = DEFAULT_RESERVED_DECODE_TOKENS
    decode_extra_slots: int | None = None
    """--disaggregation-decode-extra-slots (None: SGLang's default, `extra_slots`)."""
    kv_dtype_bytes: float = 2.0
    efficiency: Efficiency | None = None
    """None: the GPU's own (`Efficiency.for_gpu`)."""

    @classmethod
    def from_launch(
        cls,
        launch: WorkerLaunch,
        *,
        model: ModelShape | None = None,
        gpu: GpuSpec | None = None,
        efficiency: Efficiency | None = None,
    ) -> InstanceConfig:
        """The instance `launch` starts, with SGLang's defaults where it sets nothing.

        `model` and `gpu` are its model and GPU when the caller has resolved them already
        (else from `launch.model_path` and `launch.gpu_type`; `UnknownGpuError` for a GPU
        kit.perf does not know)."""
        par = launch.parallelism
        return cls(
            model=model or resolve_model(launch.model_path),
            gpu=gpu or gpu_spec(launch.gpu_type or DEFAULT_GPU),
            tp=par.tp,
            dp=par.dp,
            dp_attention=par.dp_attention,
            ep=par.ep,
            pp=par.pp,
            gpus_per_node=launch.gpus_per_node,
            page_size=launch.page_size or DEFAULT_PAGE_SIZE,
            chunked_prefill_size=launch.chunked_prefill_size,
            mem_fraction_static=launch.mem_fraction_static,
            max_total_tokens=launch.max_total_tokens,
            max_running_requests=launch.max_running_requests,
            max_prefill_tokens=launch.max_prefill_tokens or DEFAULT_MAX_PREFILL_TOKENS,
            context_length=launch.context_length,
            mixed_chunk=launch.enable_mixed_chunk,
            reserved_decode_tokens=(
                DEFAULT_RESERVED_DECODE_TOKENS
                if launch.num_reserved_decode_tokens is None
                else launch.num_reserved_decode_tokens
            ),
            decode_extra_slots=launch.disaggregation_decode_extra_slots,
            kv_dtype_bytes=kv_dtype_bytes(launch.kv_cache_dtype),
            efficiency=efficiency,
        )

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(
            tp=self.tp, dp=self.dp, dp_attention=self.dp_attention, ep=self.ep, pp=self.pp
        )

    @property
    def gpus(self) -> int:
        """GPUs of the instance (pp stages included)."""
        return self.parallelism.gpus

    @property
    def attn_tp(self) -> int:
        """GPUs that run one DP rank's attention and hold its KV."""
        return self.parallelism.attn_tp

    @property
    def context_len(self) -> int:
        """The context length the instance serves: --context-length, else the model's."""
        return self.context_length or self.model.context_len

    def build_timing(self) -> TimingModel:
        return TimingModel(
            self.model,
            self.gpu,
            self.parallelism,
            self.kv_dtype_bytes,
            self.efficiency,
            gpus_per_node=self.gpus_per_node,
        )

    def memory(self, timing: TimingModel | None = None) -> MemoryPlan:
        """How SGLang sizes this instance (KV capacity 0: the weights leave no room)."""
        return plan_memory(
            timing or self.build_timing(),
            self.context_len,
            chunked_prefill_size=self.chunked_prefill_size,
            mem_fraction_static=self.mem_fraction_static,
            max_total_tokens=self.max_total_tokens,
            max_running_requests=self.max_running_requests,
        )

    def fits(self) -> bool:
        """True when the weights leave room for at least one KV page."""
        return self.memory().capacity_tokens >= self.page_size

    def build(
        self,
        mode: Mode,
        clock: Clock,
        *,
        launched: Mode | None = None,
        timing: TimingModel | None = None,
        on_step: Callable[[Scheduler, Step], None] | None = None,
        counting: bool = False,
    ) -> list[Scheduler]:
        """The instance's schedulers, one per DP rank, on `clock` (sharing `timing` when
        given; `on_step` is called after each of their steps), serving `mode`; `launched` is
        the mode it started in where a role switch changed it (its request slots stay).
        `counting`: `CountingScheduler`s, for sinks that only record (see its contract)."""
        timing = timing or self.build_timing()
        memory = self.memory(timing)
        if memory.capacity_tokens < self.page_size:
            weights = timing.weight_bytes_per_gpu() / 1024**3
            raise ValueError(
                f"{self.model.name} does not fit on {self.tp} x {self.gpu.name}: "
                f"{weights:.1f} GiB of weights per GPU leave no KV room. To fix: raise tp."
            )
        kind = CountingScheduler if counting else Scheduler
        return [
            kind(
                mode=mode,
                timing=timing,
                pool=KvPages(memory.capacity_tokens // self.page_size, self.page_size),
                clock=clock,
                max_running=self.rank_slots(memory),
                extra_slots=self.extra_slots(launched or mode),
                chunk_size=memory.chunked_prefill_size,
                max_prefill_tokens=self.max_prefill_tokens,
                mixed_chunk=self.mixed_chunk,
                reserved_decode_tokens=self.reserved_decode_tokens,
                on_step=on_step,
            )
            for _ in range(self.dp)
        ]

    def extra_slots(self, mode: Mode) -> int:
        """Request slots of one DP rank on top of `rank_slots` that only requests in KV
        transfer may take, for an instance launched in `mode` (SGLang 0.5.23's
        `disaggregation_decode_extra_slots`, fixed at launch: a role switch keeps them). The
        flag's value where it is set; else, on a decode launch with --max-running-requests of
        at most 32 per rank, twice that (pd_disaggregation_hook.py), and 0 otherwise (a
        prefill launch, role switch or not: kv_cache_configurator.py)."""
        if self.decode_extra_slots is not None:
            return self.decode_extra_slots
        if mode is not Mode.DECODE or self.max_running_requests is None:
            return 0
        per_rank = max(1, self.max_running_requests // self.dp)
        return 2 * per_rank if per_rank <= 32 else 0

    def rank_slots(self, memory: MemoryPlan) -> int:
        """Request slots of one DP rank: SGLang splits the slots between DP-attention ranks."""
        if self.dp_attention:
            return max(1, memory.max_running_requests // self.dp)
        return memory.max_running_requests


@dataclass(frozen=True)
class Instances:
    """`count` instances launched with the same `config`."""

    config: InstanceConfig
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"Instances.count must be >= 1, not {self.count}")

    @property
    def gpus(self) -> int:
        return self.count * self.config.gpus


@dataclass
class Outcome:
    """What one request saw, in model seconds. `first_token` and `finish` are None when it
    failed; its TTFT and TPOT are then infinite."""

    request: Request
    first_token: float | None = None
    finish: float | None = None
    tokens: int = 0

    @property
    def ttft_s(self) -> float:
        """Time to first token (s) from the request's arrival."""
        return (
            (self.first_token - self.request.arrival)
            if self.first_token is not None
            else float("inf")
        )

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (s)."""
        if self.first_token is None or self.finish is None:
            return float("inf")
        return (self.finish - self.first_token) / (self.tokens - 1) if self.tokens > 1 else 0.0


class _Recorder:
    """A SequenceSink that records times; PD hooks are plugged in per deployment."""

    def __init__(self, outcome: Outcome, record_first: bool = True) -> None:
        self.outcome = outcome
        self.record_first = record_first
        self.prefilled: Callable[[Seq, float], None] | None = None
        self.reserved: Callable[[Seq, float], None] | None = None

    def on_token(self, seq: Seq, now: float, reason: FinishReason | None) -> FinishReason | None:
        if self.record_first and self.outcome.first_token is None:
            self.outcome.first_token = now
        self.outcome.tokens = seq.generated
        return reason

    def on_finish(self, seq: Seq, reason: FinishReason, now: float) -> None:
        # A counting scheduler does not tell of every token; the count is exact here.
        self.outcome.tokens = seq.generated
        if reason.kind != "abort" and self.record_first:
            self.outcome.finish = now

    def on_prefilled(self, seq: Seq, now: float) -> None:
        if self.prefilled is not None:
            self.prefilled(seq, now)

    def on_reserved(self, seq: Seq, now: float) -> None:
        if self.reserved is not None:
            self.reserved(seq, now)


@dataclass(frozen=True)
class Cluster:
    """A deployment: `colocated` instances alone, or `prefill` and/or `decode` instances
    (both: a PD cluster; one: DistServe's prefill-only or decode-only set-up). `rdma`: KV
    moves over RDMA (else Mooncake over TCP); `pool_rdma`: a request's `pool_tokens` load from
    the KV pool over RDMA (None: as the KV moves)."""

    colocated: Instances | None = None
    prefill: Instances | None = None
    decode: Instances | None = None
    rdma: bool = True
    pool_rdma: bool | None = None

    def __post_init__(self) -> None:
        if self.colocated is not None and (self.prefill or self.decode):
            raise ValueError("a Cluster has colocated instances or prefill/decode ones, not both")
        if not (self.colocated or self.prefill or self.decode):
            raise ValueError("a Cluster needs colocated, prefill or decode instances")

    @property
    def kind(self) -> Kind:
        if self.colocated is not None:
            return "colocated"
        if self.prefill is not None and self.decode is not None:
            return "pd"
        return "prefill-only" if self.prefill is not None else "decode-only"

    @property
    def gpus(self) -> int:
        groups = (self.colocated, self.prefill, self.decode)
        return sum(group.gpus for group in groups if group is not None)

    def run(self, workload: Sequence[Request]) -> list[Outcome]:
        """Serve `workload` to completion on a fresh virtual clock; one outcome per request,
        in the workload's order."""
        return _Run(self, VirtualClock()).serve(workload)


class _Run:
    """One run of a cluster: its schedulers on one clock."""

    def __init__(self, cluster: Cluster, clock: VirtualClock) -> None:
        self.cluster = cluster
        self.clock = clock

        def build(group: Instances | None, mode: Mode) -> list[Scheduler]:
            if group is None:
                return []
            return [
                rank
                for _ in range(group.count)
                for rank in group.config.build(mode, clock, counting=True)
            ]

        if cluster.colocated is not None:
            self.prefills = build(cluster.colocated, Mode.NULL)
        else:
            self.prefills = build(cluster.prefill, Mode.PREFILL)
        self.decodes = build(cluster.decode, Mode.DECODE)

    def serve(self, workload: Sequence[Request]) -> list[Outcome]:
        p_cycle = itertools.cycle(self.prefills) if self.prefills else None
        d_cycle = itertools.cycle(self.decodes) if self.decodes else None
        outcomes = [Outcome(r) for r in workload]
        for i, (req, out) in enumerate(zip(workload, outcomes, strict=True)):
            p = next(p_cycle) if p_cycle else None
            d = next(d_cycle) if d_cycle else None
            self.clock.call_at(req.arrival, self._arrival(str(i), req, out, p, d))
        self.clock.run()
        return outcomes

    def _arrival(
        self, rid: str, req: Request, out: Outcome, p: Scheduler | None, d: Scheduler | None
    ) -> Callable[[], None]:
        clock = self.clock
        kind = self.cluster.kind

        def arrive() -> None:
            if kind == "colocated" and p is not None:
                p.submit(Seq(rid, req.prompt_len, req.output_len, _Recorder(out)))
            elif kind == "prefill-only" and p is not None:
                sink = _Recorder(out)

                def handed_off(seq: Seq, now: float) -> None:
                    # Prefill-only: the first token is out when the prefill ends.
                    out.first_token = out.finish = now
                    out.tokens = 1
                    clock.call_at(now, lambda: p.transfer_done(seq))

                sink.prefilled = handed_off
                p.submit(Seq(rid, req.prompt_len, 1, sink))
            elif kind == "decode-only" and d is not None:
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
        rdma = self.cluster.rdma
        d_sink = _Recorder(out)
        d_seq = Seq(rid, req.prompt_len, req.output_len, d_sink)
        p_sink = _Recorder(Outcome(req), record_first=False)

        def prefilled(seq: Seq, now: float) -> None:
            # The side with fewer NICs (fewer attention GPUs) bounds the transfer.
            delay = max(
                p.timing.kv_transfer_seconds(req.prompt_len, rdma=rdma),
                d.timing.kv_transfer_seconds(req.prompt_len, rdma=rdma),
            )

            def landed() -> None:
                p.transfer_done(seq)
                d.kv_arrived(d_seq)

            clock.call_at(now + delay, landed)

        pool_rdma = rdma if self.cluster.pool_rdma is None else self.cluster.pool_rdma
        # HiCache: a prefix from the pool is loaded (over the pool's link, the GPU free
        # meanwhile) before the prefill computes the rest of the prompt.
        load = (
            p.timing.kv_transfer_seconds(req.pool_tokens, rdma=pool_rdma) if req.pool_tokens else 0
        )

        def start_prefill() -> None:
            seq = Seq(rid, req.prompt_len, 1, p_sink)
            seq.computed = min(req.cached_tokens, req.prompt_len - 1)
            p.submit(seq)

        def reserved(seq: Seq, now: float) -> None:
            # The prefill leaves its bootstrap queue once the decode has sent its KV pages.
            clock.call_at(now + load, start_prefill)

        p_sink.prefilled = prefilled
        d_sink.reserved = reserved
        d.submit(d_seq)
