"""Stand-in for the CPU build of sgl-kernel, for SGLang 0.5.23 on CPUs without AMX.

Why: with SGLANG_USE_CPU_ENGINE=1, SGLang imports `sgl_kernel` at module level on the CPU path
(sglang/srt/mem_cache/allocation.py:46, sglang/kernels/ops/kvcache/cache_move.py:10). The CPU
build of sgl-kernel is not on PyPI (source only, aimed at AMX Xeons, an hour or more to build
on 2 cores), and PyPI's `sglang-kernel` 0.4.10 is CUDA-only.

What: one real op, `assign_req_to_token_pool_cpu`, which the CPU engine calls on every batch
(sglang/srt/mem_cache/allocation.py:746). Every other name resolves to a stub that raises
NotImplementedError naming the op, so an import succeeds and a call says exactly what is
missing instead of failing somewhere deeper.

Safe because SGLang picks its AMX kernels by probing `torch.ops.sgl_kernel`
(sglang/srt/utils/common.py:356-358 `_is_intel_amx_backend_available`, and
sglang/srt/models/utils.py:456), never this module's attributes. This module registers no
torch ops, so those probes stay False and SGLang takes its pure-torch paths
(sglang/kernels/fused_op.py:187 dispatches to "cpu" only with AMX).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, NoReturn

import torch

__version__ = "0.0.0+pdkit.cpu.compat"


def assign_req_to_token_pool_cpu(  # noqa: PLR0917 (SGLang's positional call)
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Same contract as SGLang's Triton kernel `assign_req_to_token_pool`
    (sglang/srt/mem_cache/allocation.py, used on CUDA): for request i, row
    req_pool_indices[i] gets out_cache_loc's next (end_offset[i] - start_offset[i]) entries at
    columns [start_offset[i], end_offset[i]); out_cache_loc is the concatenation over requests.
    """
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), starts, ends, strict=True):
        if end > pool_len:
            raise ValueError(
                f"assign_req_to_token_pool_cpu: end {end} beyond the pool row length {pool_len}"
            )
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[offset : offset + count].to(req_to_token.dtype)
        offset += count


def _stub(name: str) -> Callable[..., NoReturn]:
    def missing(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this is pdkit's CPU stand-in for sgl-kernel "
            "(tools/sglang_cpu/compat/sgl_kernel), which implements only "
            "assign_req_to_token_pool_cpu. This SGLang feature needs the real sgl-kernel "
            "(CUDA, or its CPU build for AMX)."
        )

    missing.__name__ = missing.__qualname__ = name
    return missing


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # keep Python's own probes (__path__, __spec__, ...) honest
        raise AttributeError(name)
    return _stub(name)


class _StubModule(types.ModuleType):
    """`from sgl_kernel.<sub> import <op>` gets a stub too."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{self.__name__.removeprefix('sgl_kernel.')}.{name}")


# The submodules SGLang 0.5.23 imports from unguarded on the CPU path, at module import:
#   mamba:       srt/layers/attention/linear/gdn_backend.py:184, kda_backend.py:39,
#                srt/layers/attention/linear/kernels/gdn_triton.py:28 (`elif is_cpu():`)
#   speculative: sglang/kernels/ops/speculative/reconstruct_tree.py:50 (`elif not _is_xpu:`)
# The others it names (flash_attn, kvcacheio, quantization, scalar_type, utils, elementwise)
# sit behind CUDA/XPU checks or a try/except ImportError with a pure-Python fallback
# (srt/layers/quantization/utils.py:27, scalar_type): they must stay missing, so the import
# fails and SGLang takes its fallback.
for _sub in ("mamba", "speculative"):
    _module = _StubModule(f"{__name__}.{_sub}")
    sys.modules[_module.__name__] = _module
    globals()[_sub] = _module
