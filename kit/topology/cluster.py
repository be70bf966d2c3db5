"""The schema of `cluster:`: timeouts and caches a large or wide-EP cluster needs, and the
profile that sets them together (shape only; `kit.sglang.render` renders them, the Plan carries
the readiness timeout).

A cold wide-EP start (DeepSeek-V3/R1 over several 8-GPU nodes with DeepEP) JIT-compiles
DeepGEMM's kernels on its first batches (`--compile-deep-gemm` skips multi-node instances), loads
hundreds of GB of weights, and runs collectives across every node: SGLang's defaults (a 300 s
watchdog, a decode that counts a prefill offline after 2 missed heartbeats, torch.distributed's
own timeout) and pdkit's 1800 s readiness wait end such a start before it is done. srt-slurm's
wide-EP recipes raise each of them; `profile: wide_ep` does the same, and keeps DeepGEMM's
compiled kernels in a folder under the host's root that survives restarts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kit.topology.strict import Strict

Profile = Literal["standard", "wide_ep"]


class ProfileValues(Strict):
    """What a profile sets where `cluster:` leaves a key unset (None: SGLang's or pdkit's own
    default stays)."""

    watchdog_timeout_s: float | None = None
    distributed_timeout_s: int | None = None
    heartbeat_max_failures: int | None = None
    deep_gemm_cache: bool = False
    readiness_timeout_s: float | None = None


PROFILES: dict[str, ProfileValues] = {
    "standard": ProfileValues(),
    "wide_ep": ProfileValues(
        watchdog_timeout_s=3600,
        distributed_timeout_s=3600,
        heartbeat_max_failures=60,
        deep_gemm_cache=True,
        readiness_timeout_s=3600,
    ),
}
"""Each profile's values (docs/topology.md shows them)."""


class Cluster(Strict):
    """Timeouts and caches of a large or wide-EP cluster. `profile: wide_ep` sets them all for a
    multi-node DeepEP deployment; a key set here wins over the profile's value."""

    profile: Profile = Field(
        "standard",
        description="standard: SGLang's and pdkit's defaults. wide_ep: watchdog 3600 s, "
        "distributed timeout 3600 s, 60 heartbeat failures (5 min at the 5 s interval), a "
        "DeepGEMM cache under the host's root, readiness timeout 3600 s.",
    )
    watchdog_timeout_s: float | None = Field(
        None,
        gt=0,
        description="--watchdog-timeout on every worker: a scheduler step stuck this long "
        "kills the server (SGLang's default 300). A role's `args` still win.",
    )
    distributed_timeout_s: int | None = Field(
        None,
        gt=0,
        description="torch.distributed's timeout for the collectives of start-up, seconds "
        "(--dist-timeout and TORCH_DISTRIBUTED_DEFAULT_TIMEOUT on every worker).",
    )
    heartbeat_max_failures: int | None = Field(
        None,
        ge=1,
        description="Missed heartbeats after which a decode counts a prefill offline "
        "(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE); transfer.timeouts."
        "heartbeat_max_failures, when set, wins.",
    )
    deep_gemm_cache_dir: str | None = Field(
        None,
        description="Folder on every host where DeepGEMM keeps its compiled kernels "
        "(SGLANG_DG_CACHE_DIR), kept across restarts and `pdkit down`; a relative path is "
        "under the host's root. Default with profile wide_ep: var/cache/pdkit/deep_gemm.",
    )
    readiness_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Seconds `pdkit up` waits for the workers to become ready (default: 120 "
        "for engine sim, 1800 for sglang; `pdkit up --timeout` wins).",
    )

    @property
    def defaults(self) -> ProfileValues:
        """The profile's values."""
        return PROFILES[self.profile]

    @property
    def watchdog(self) -> float | None:
        return self.watchdog_timeout_s or self.defaults.watchdog_timeout_s

    @property
    def distributed_timeout(self) -> int | None:
        return self.distributed_timeout_s or self.defaults.distributed_timeout_s

    @property
    def readiness_timeout(self) -> float | None:
        return self.readiness_timeout_s or self.defaults.readiness_timeout_s

    @property
    def deep_gemm_dir(self) -> str | None:
        """The cache folder as the topology says it (relative: under the host's root)."""
        if self.deep_gemm_cache_dir is not None:
            return self.deep_gemm_cache_dir
        return DEEP_GEMM_CACHE if self.defaults.deep_gemm_cache else None


DEEP_GEMM_CACHE = "var/cache/pdkit/deep_gemm"
"""wide_ep's DeepGEMM cache, under the host's root: shared by every worker and deployment on
the host (DeepGEMM keys its kernels by shape), and left by `pdkit down`."""
