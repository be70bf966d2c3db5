"""How one instance is launched, as typed values: its parallelism and the launch record the
performance model runs it by.

The Plan carries a `WorkerLaunch` per instance, filled from the topology (never decoded from
the argv kit renders); `kit.perf.cluster.InstanceConfig.from_launch` is the one way from it to
a modelled instance, and the sim worker builds the same record from its own argv at its edge.
`Parallelism` is the one place where GPUs per instance and attention TP are counted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Parallelism(BaseModel):
    """How one instance spreads over GPUs (SGLang's --tp-size, --dp-size, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    ep: int = 1
    pp: int = 1

    @property
    def attn_tp(self) -> int:
        """GPUs that run one DP rank's attention and hold its KV (tp / dp with DP attention;
        SGLang's attention-TP size)."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def attention_dp(self) -> bool:
        """Whether attention runs data-parallel (SGLang's attn_dp_size > 1), which moves its
        ZMQ sockets to TCP ports (`kit.topology.ports.dist_init_ports`)."""
        return self.dp_attention and self.dp > 1

    @property
    def gpus(self) -> int:
        """GPUs of the whole instance, over all its nodes (pp stages included)."""
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)


class WorkerLaunch(BaseModel):
    """The launch values of one instance that decide what it holds and how fast it runs.

    None means SGLang's default (resolved by the performance model for the GPU and parallelism,
    as SGLang resolves it at start-up)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str = Field(description="--model-path: a Hugging Face repo id or a path.")
    device: Literal["cuda", "cpu"] = Field(
        "cuda", description="What it computes on: its host's `device` (cpu: --device cpu)."
    )
    gpu_type: str | None = Field(
        description="The GPU the instance runs on (the host's gpu_type; engine sim: the "
        "PDKIT_SIM_GPU it emulates); None: not said (modelled as H100-SXM)."
    )
    parallelism: Parallelism
    nnodes: int = Field(1, description="Hosts the instance spans.")
    page_size: int | None = Field(None, description="--page-size (tokens per KV page).")
    kv_cache_dtype: str = Field("auto", description="--kv-cache-dtype.")
    mem_fraction_static: float | None = Field(None, description="--mem-fraction-static.")
    max_running_requests: int | None = Field(None, description="--max-running-requests.")
    max_total_tokens: int | None = Field(None, description="--max-total-tokens.")
    max_prefill_tokens: int | None = Field(None, description="--max-prefill-tokens.")
    chunked_prefill_size: int | None = Field(None, description="--chunked-prefill-size.")
    context_length: int | None = Field(None, description="--context-length.")
    enable_mixed_chunk: bool = Field(False, description="--enable-mixed-chunk.")
    moe_a2a_backend: str | None = Field(
        None, description="--moe-a2a-backend (deepep: provisioning checks the driver's IBGDA)."
    )
    num_reserved_decode_tokens: int | None = Field(
        None, description="--num-reserved-decode-tokens."
    )
    disaggregation_decode_extra_slots: int | None = Field(
        None, description="--disaggregation-decode-extra-slots."
    )
    speed: float = Field(
        1.0,
        description="Model seconds per wall second: engine sim's PDKIT_SIM_SPEED, 1 on GPUs.",
    )

    @property
    def gpus(self) -> int:
        """GPUs of the instance, over all its nodes."""
        return self.parallelism.gpus

    @property
    def gpus_per_node(self) -> int:
        """GPUs the instance uses on each of its hosts."""
        return max(1, self.gpus // self.nnodes)
