"""GPU specs: the numbers the timing model needs about one GPU, from vendor datasheets.

Names are the ones topologies use in ``gpu_type`` (and the sim in ``PDKIT_SIM_GPU``); common
spellings map to them through `GPU_ALIASES`. Units: FLOP/s, bytes/s, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.errors import PdkitError

GIB = 1024**3

DEFAULT_GPU = "H100-SXM"
"""The GPU modelled when a deployment does not say its GPU type (nor engine sim's PDKIT_SIM_GPU)."""


# Measured on one H200 SXM (driver 580.159, torch 2.11 cu130) on 2026-12-04 by
# tools/gpu_calibrate.py; raw timings in benchmarks/data/h200-calibration.json, fitted by
# tools/fit_perf.py (docs/sim.md, "Calibration on an H200"). Random-weights Llama-3.1-8B, the
# same with 4 layers, and Llama-3.2-1B in plain PyTorch (cuBLAS GEMMs, torch's FA2 attention,
# unfused norms and rotary), decode steps replayed from CUDA graphs: not SGLang's kernels.
# * Memory: each byte a decode step streams cost 1 / (0.83 x 4.8 TB/s) (least squares over 60
#   steps, batch 1-256, context 512-32k, relative RMS error 6.9%; a plain copy reached 0.88).
#   The weights' GEMMs are the cuBLAS ones SGLang runs for bf16 layers: kept for the H200.
# * Compute: long prefills reached 0.55-0.59 of peak on the 8B's layers, 0.50 over all three
#   shapes and cached prefixes, whose attention ran through torch's FA2 at about 0.35 (SGLang
#   runs FA3 or FlashInfer on Hopper): the sourced 0.6 stands.
# * Fixed costs: 50 us a step and 85 us a layer, plain PyTorch's ~30 unfused kernels a layer
#   and no scheduler, not SGLang's fused kernels and overlap scheduler: the sourced overheads
#   stand.
H200_MEASURED = (
    "plain-PyTorch prefill and CUDA-graph decode timings on one H200, 2026-12-04 "
    "(benchmarks/data/h200-calibration.json, tools/fit_perf.py)"
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU. FLOP/s are dense (no sparsity); bandwidths are per direction."""

    name: str
    bf16_flops: float
    fp8_flops: float  # 0: no FP8 tensor cores (FP8 weights are dequantised to BF16)
    hbm_bandwidth: float
    memory_bytes: float
    link_bandwidth: float  # GPU-to-GPU within a node: NVLink, or PCIe where there is none
    source: str
    # Measured on this GPU (`measured` says how): the achieved fractions of peak that replace
    # kit.perf.timing's sourced COMPUTE_EFFICIENCY / MEMORY_EFFICIENCY for it (None: keep them).
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    measured: str = ""

    def flops(self, weight_bytes: float) -> float:
        """Peak dense FLOP/s for weights of `weight_bytes` per element."""
        return self.fp8_flops if weight_bytes <= 1.0 and self.fp8_flops else self.bf16_flops


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            "A100-40G",
            312e12,
            0.0,
            1555e9,
            40 * GIB,
            300e9,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB; NVLink 600 GB/s total)",
        ),
        GpuSpec(
            "A100-80G",
            312e12,
            0.0,
            2039e9,
            80 * GIB,
            300e9,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB; NVLink 600 GB/s total)",
        ),
        GpuSpec(
            "H100-SXM",
            989e12,
            1979e12,
            3.35e12,
            80 * GIB,
            450e9,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5; NVLink 900 GB/s total)",
        ),
        GpuSpec(
            "H200",
            989e12,
            1979e12,
            4.8e12,
            141 * GIB,
            450e9,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM; NVLink 900 GB/s total)",
            memory_efficiency=0.83,
            measured=H200_MEASURED,
        ),
        GpuSpec(
            "B200",
            2.25e15,
            4.5e15,
            8.0e12,
            180 * GIB,
            900e9,
            "NVIDIA DGX B200 datasheet (per GPU: 1/8 of 72 PF FP8 sparse, 64 TB/s, "
            "1,440 GB; NVLink 5 1.8 TB/s total)",
        ),
        GpuSpec(
            "L40S",
            362e12,
            733e12,
            864e9,
            48 * GIB,
            32e9,
            "NVIDIA L40S datasheet (GDDR6; no NVLink: PCIe Gen4 x16)",
        ),
    )
}

GPU_ALIASES = {
    "A100": "A100-80G",
    "A100-80GB": "A100-80G",
    "A100-SXM4-80GB": "A100-80G",
    "A100-40GB": "A100-40G",
    "A100-SXM4-40GB": "A100-40G",
    "H100": "H100-SXM",
    "H100-80G": "H100-SXM",
    "H100-SXM5": "H100-SXM",
    "H100-80GB": "H100-SXM",
    "H200-SXM": "H200",
    "H200-141G": "H200",
    "B200-SXM": "B200",
}


class UnknownGpuError(PdkitError, ValueError):
    """A GPU name that is neither in `GPUS` nor an alias in `GPU_ALIASES`."""


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU up by name or alias, ignoring case."""
    by_upper = {k.upper(): v for k, v in GPUS.items()}
    key = name.strip().upper()
    alias = {k.upper(): v for k, v in GPU_ALIASES.items()}.get(key)
    spec = by_upper.get(alias.upper() if alias else key)
    if spec is None:
        raise UnknownGpuError(
            f"{name!r} is not a GPU the performance model knows; use one of {', '.join(GPUS)}"
        )
    return spec
