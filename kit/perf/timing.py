"""The timing model: how long a forward step takes on given GPUs, and how much KV fits.

One roofline per step (Williams et al., "Roofline", CACM 2009; applied to LLM inference by
Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023):

    step = max(FLOPs / (GPUs x peak x COMPUTE_EFFICIENCY),
               bytes / (HBM bandwidth x MEMORY_EFFICIENCY))
           + tensor-parallel all-reduces + pipeline hops
           + STEP_OVERHEAD_S + LAYER_OVERHEAD_S x layers

* FLOPs: 2 x active parameters per token (linear layers, LM head for the tokens that sample),
  plus attention (QK^T and AV) for every (query, context) pair. A prefill is compute-bound.
* Bytes: every weight a step touches, read once per step (for MoE, the experts the batch's
  tokens route to), plus the KV cache the step's attention reads and the KV it writes. A
  decode step is memory-bound: weights plus the whole batch's KV.
* A step that mixes prefill chunks with decodes (``--disaggregation-mode null``) pays the
  prefill's compute time in every decoding request's inter-token latency: the interference
  PD disaggregation removes.

Every constant is named here with its source; GPU numbers are in `kit.perf.gpus`, with the
efficiencies measured on a GPU where one was (`Efficiency.for_gpu`; docs/sim.md, "Calibration on
an H200").
Units: seconds, bytes, FLOP/s, bytes/s, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kit.perf.gpus import GpuSpec
from kit.perf.models import ModelShape
from kit.topology.launch import Parallelism

# Achieved fraction of dense tensor-core peak for a whole prefill forward (GEMMs, attention,
# norms, activations). cuBLAS GEMMs at LLM shapes reach 70-80% of peak (NVIDIA "Matrix
# Multiplication Background User's Guide"); FlashAttention-2 reaches 50-73% on A100 (Dao 2023);
# end-to-end model FLOPs utilisation of large transformer forward/backward passes is 50-57%
# on A100 (Narayanan et al., "Efficient Large-Scale Language Model Training", SC'21). We take
# the middle of that range.
COMPUTE_EFFICIENCY = 0.6

# Achieved fraction of peak HBM bandwidth while a decode step streams weights and KV:
# "LLM Inference Performance Engineering: Best Practices" (Databricks/MosaicML, Oct 2023)
# reports memory-bandwidth utilisation of 55-65% for 7B-70B models at small batch on
# A100/H100 with TensorRT-LLM, higher for larger batches; STREAM-type copies reach ~90%.
MEMORY_EFFICIENCY = 0.7

# Fixed cost per forward step not hidden by SGLang's overlap scheduler: kernel launch gaps
# outside CUDA graphs, sampling, output processing. SGLang's v0.4 blog ("zero-overhead batch
# scheduler", Dec 2024) shows per-step CPU work of a few ms moved off the critical path; the
# residual on Nsight traces is about 1-2 ms.
STEP_OVERHEAD_S = 0.0015
# Per decoder layer and step: the ~10 small kernels of a layer (norms, rotary, activation,
# residual adds) each cost a few microseconds of launch and tail even inside a CUDA graph.
LAYER_OVERHEAD_S = 10e-6

# NCCL all-reduce: per-call latency for small messages and achieved bus bandwidth as a
# fraction of link bandwidth (nccl-tests all_reduce_perf: ~10 us small-message latency on
# NVLink, bus bandwidth ~80% of the unidirectional NVLink rate for large messages).
ALLREDUCE_LATENCY_S = 10e-6
ALLREDUCE_BUS_EFFICIENCY = 0.8
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style tensor parallel)

# Between nodes (TP or PP across hosts) and for KV transfer: one 400 Gb/s NIC per GPU
# (NVIDIA ConnectX-7 NDR, as in DGX H100/A100 reference designs), ~80% achieved by RDMA
# writes (Mooncake paper, Qin et al. FAST'25, Fig. 7: ~87 of 100 GB/s on 8x200 Gb/s).
NIC_BANDWIDTH = 400e9 / 8
RDMA_EFFICIENCY = 0.8
INTERNODE_LATENCY_S = 5e-6
# Mooncake over TCP (`mooncake_tcp`): one 100 Gb/s host NIC shared by the instance, ~60%
# achieved by kernel TCP on bulk writes.
TCP_HOST_BANDWIDTH = 100e9 / 8
TCP_EFFICIENCY = 0.6
KV_TRANSFER_SETUP_S = 0.0005  # per request: notification round trip plus write submission


@dataclass(frozen=True)
class StepShape:
    """What one forward step computes.

    `prefill` holds (new tokens, tokens already in the KV cache) per prefilled request;
    `decode_reqs` requests decode one token each over `decode_context` cached tokens in all;
    `sampled` is how many tokens go through the LM head.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_reqs: int = 0
    decode_context: int = 0
    sampled: int = 0

    @property
    def tokens(self) -> int:
        return sum(c for c, _ in self.prefill) + self.decode_reqs


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak; the defaults are the sourced constants above, `for_gpu` the
    factors a GPU was measured at. Other values calibrate the model to a measured system (a
    planner fits them to benchmarks)."""

    compute: float = COMPUTE_EFFICIENCY
    memory: float = MEMORY_EFFICIENCY

    @classmethod
    def for_gpu(cls, gpu: GpuSpec) -> Efficiency:
        """The uncalibrated factors for `gpu`: what was measured on it (`GpuSpec.measured`),
        else the sourced constants above."""
        return cls(
            compute=gpu.compute_efficiency or COMPUTE_EFFICIENCY,
            memory=gpu.memory_efficiency or MEMORY_EFFICIENCY,
        )


class TimingModel:
    """Step times and KV capacity for one DP rank of one instance launched with `par`, on
    `gpus_per_node` GPUs per host: the rank's `par.attn_tp` GPUs run its attention and hold
    its KV, its `par.tp` GPUs share the MLP/expert weights, its `par.pp` stages the layers;
    `efficiency` None: the GPU's own (`Efficiency.for_gpu`)."""

    def __init__(
        self,
        model: ModelShape,
        gpu: GpuSpec,
        par: Parallelism,
        kv_dtype_bytes: float = 2.0,
        efficiency: Efficiency | None = None,
        *,
        gpus_per_node: int = 8,
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.par = par
        self.gpus_per_node = gpus_per_node
        self.kv_dtype_bytes = kv_dtype_bytes
        self.efficiency = efficiency = efficiency or Efficiency.for_gpu(gpu)
        m = model
        self._flops = gpu.flops(m.weight_bytes) * efficiency.compute * par.attn_tp
        self._mem_bw = gpu.hbm_bandwidth * efficiency.memory
        attn_weights = m.layers * m.attention_params()
        other_dense = m.layer_params() - attn_weights + m.vocab * m.hidden  # + LM head
        # Bytes every GPU of the rank reads per step whatever the batch.
        self.fixed_weight_bytes = (
            (attn_weights / par.attn_tp + other_dense / par.tp) * m.weight_bytes / par.pp
        )
        self._expert_bytes = m.expert_params() * m.weight_bytes / par.tp / par.pp
        self._linear_flops_per_token = 2.0 * (
            m.layer_params() + m.moe_layers * m.experts_per_token * m.expert_params()
        )
        shard = 1 if m.is_mla else min(par.attn_tp, m.kv_heads)
        self.kv_bytes_per_token = m.kv_bytes_per_token(kv_dtype_bytes)
        self.kv_bytes_per_token_per_gpu = self.kv_bytes_per_token / shard / par.pp
        # Per-step constants, computed as the step formulas would (the same floats).
        self._head_flops_per_token = 2.0 * m.vocab * m.hidden  # LM head, per sampled token
        self._pair_flops = m.attention_flops_per_pair()
        self._expert_miss = 1.0 - m.experts_per_token / m.experts if m.is_moe else 1.0
        self._overhead_s = self.overhead_seconds()

    # -- memory ----------------------------------------------------------------------------

    def weight_bytes_per_gpu(self) -> float:
        """Resident weights on one GPU (all experts, not only the touched ones)."""
        m = self.model
        input_embedding = m.embedding_params() - m.vocab * m.hidden
        rest = (m.routed_params() + input_embedding) * m.weight_bytes / self.par.tp / self.par.pp
        return self.fixed_weight_bytes + rest

    def kv_capacity_tokens(self, mem_fraction_static: float) -> int:
        """Tokens of KV one rank can hold: SGLang sizes the pool as
        ``mem_fraction_static x GPU memory - weights`` per GPU."""
        free = mem_fraction_static * self.gpu.memory_bytes - self.weight_bytes_per_gpu()
        return max(0, int(free // self.kv_bytes_per_token_per_gpu))

    # -- time ------------------------------------------------------------------------------

    def step_seconds(self, step: StepShape) -> float:
        """Modelled wall time of one forward step, in seconds (0 for an empty step)."""
        tokens = step.tokens
        if tokens == 0:
            return 0.0
        compute_s, memory_s = self._roofline(step, tokens)
        return max(compute_s, memory_s) + self._comm_seconds(tokens) + self._overhead_s

    def overhead_seconds(self) -> float:
        """The fixed cost of one step on one pipeline stage's layers."""
        return STEP_OVERHEAD_S + LAYER_OVERHEAD_S * self.model.layers / self.par.pp

    def roofline_seconds(self, step: StepShape) -> tuple[float, float]:
        """The step's two roofline terms, in seconds at this model's efficiencies: (FLOPs over
        achieved FLOP/s, bytes moved over achieved bandwidth)."""
        return self._roofline(step, step.tokens)

    def _roofline(self, step: StepShape, tokens: int) -> tuple[float, float]:
        m = self.model
        pairs = float(step.decode_context)
        for new, cached in step.prefill:
            pairs += new * (cached + (new + 1) / 2)
        flops = (
            self._linear_flops_per_token * tokens
            + self._head_flops_per_token * step.sampled
            + self._pair_flops * pairs
        )
        compute_s = flops / self._flops
        kv_read = step.decode_context + sum(cached for _, cached in step.prefill)
        moved = (
            self.fixed_weight_bytes
            + self._touched_experts(tokens) * m.moe_layers * self._expert_bytes
            + (kv_read + tokens) * self.kv_bytes_per_token_per_gpu
        )
        return compute_s, moved / self._mem_bw

    def _touched_experts(self, tokens: int) -> float:
        """Expected distinct experts per MoE layer that `tokens` tokens route to, with
        uniform routing: E x (1 - (1 - k/E)^tokens)."""
        m = self.model
        if not m.is_moe:
            return 0.0
        return m.experts * (1.0 - self._expert_miss**tokens)

    def _comm_seconds(self, tokens: int) -> float:
        par = self.par
        total = 0.0
        if par.attn_tp > 1:
            if par.attn_tp > self.gpus_per_node:  # the all-reduce crosses hosts
                bandwidth, latency = NIC_BANDWIDTH * RDMA_EFFICIENCY, INTERNODE_LATENCY_S
            else:
                bandwidth = self.gpu.link_bandwidth * ALLREDUCE_BUS_EFFICIENCY
                latency = ALLREDUCE_LATENCY_S
            size = tokens * self.model.hidden * 2.0  # bf16 activations
            ring = 2.0 * (par.attn_tp - 1) / par.attn_tp * size / bandwidth
            total += ALLREDUCES_PER_LAYER * self.model.layers * (latency + ring)
        if par.pp > 1:
            hop = tokens * self.model.hidden * 2.0 / (NIC_BANDWIDTH * RDMA_EFFICIENCY)
            total += (par.pp - 1) * (INTERNODE_LATENCY_S + hop)
        return total

    def kv_transfer_seconds(self, tokens: int, rdma: bool = True) -> float:
        """Modelled time to move `tokens` tokens of KV from a prefill to a decode instance:
        one NIC per attention GPU with RDMA, one host NIC with Mooncake over TCP."""
        if rdma:
            bandwidth = NIC_BANDWIDTH * RDMA_EFFICIENCY * self.par.attn_tp
        else:
            bandwidth = TCP_HOST_BANDWIDTH * TCP_EFFICIENCY
        return KV_TRANSFER_SETUP_S + tokens * self.kv_bytes_per_token / bandwidth


def default_chunked_prefill_size(gpu: GpuSpec) -> int:
    """SGLang 0.5.23's default by GPU memory (arg_groups/memory_hook.py)."""
    mib = gpu.memory_bytes / 1024**2
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 90 * 1024:
        return 8192
    return 16384


def default_mem_fraction_static(gpu: GpuSpec, chunked_prefill_size: int, tp: int, pp: int) -> float:
    """SGLang 0.5.23's default: GPU memory less an activation and graph reserve (MiB:
    512 + 1.5 x max(chunk, 2048) + tp x pp / 8 x 1024, at least 10 GiB above 60 GiB)."""
    mib = gpu.memory_bytes / 1024**2
    reserved = 512 + 1.5 * max(chunked_prefill_size, 2048) + tp * pp / 8 * 1024
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def default_max_running_requests(capacity_tokens: int, context_len: int) -> int:
    """SGLang's request-slot count: ``min(max(capacity / context_len x 512, 2048), 4096)``."""
    return min(max(int(capacity_tokens / max(context_len, 1) * 512), 2048), 4096)


@dataclass(frozen=True)
class MemoryPlan:
    """How SGLang sizes one rank: prefill chunk (tokens), static memory fraction (0..1), KV
    pool capacity (tokens, 0 when the weights leave no room) and request slots."""

    chunked_prefill_size: int
    mem_fraction_static: float
    capacity_tokens: int
    max_running_requests: int


def plan_memory(
    timing: TimingModel,
    context_len: int,
    *,
    chunked_prefill_size: int | None = None,
    mem_fraction_static: float | None = None,
    max_total_tokens: int | None = None,
    max_running_requests: int | None = None,
) -> MemoryPlan:
    """The launch knobs given (None or 0: SGLang's default) resolved for `timing`'s GPU and
    parallelism; the worker and the virtual-time sweep both size instances with this."""
    chunk = chunked_prefill_size or default_chunked_prefill_size(timing.gpu)
    fraction = mem_fraction_static or default_mem_fraction_static(
        timing.gpu, chunk, timing.par.tp, timing.par.pp
    )
    capacity = timing.kv_capacity_tokens(fraction)
    if max_total_tokens:
        capacity = min(capacity, max_total_tokens)
    slots = max_running_requests or default_max_running_requests(capacity, context_len)
    return MemoryPlan(chunk, fraction, capacity, slots)


def kv_dtype_bytes(kv_cache_dtype: str) -> float:
    """Bytes per KV element: ``auto`` keeps 16-bit KV (also for FP8 checkpoints)."""
    if kv_cache_dtype.startswith("fp8"):
        return 1.0
    if kv_cache_dtype.startswith("fp4"):
        return 0.5
    return 2.0


def pages(tokens: int, page_size: int) -> int:
    """Pages of `page_size` tokens that hold `tokens` tokens."""
    return math.ceil(tokens / page_size) if tokens > 0 else 0
