"""SGLang 0.5.22, the release before 0.5.23: the same CUDA 13 / torch 2.14.1 stack, older
kernels; attention DP spelled as in 0.5.23."""

from __future__ import annotations

from kit.sglang.dialects.base import Dialect, Packages
from kit.sglang.startup import v0_5_22

DIALECT = Dialect(
    version="0.5.22",
    startup_rules=v0_5_22.RULES,
    packages=Packages(
        torch="2.14.1",
        cuda="13",
        sglang_kernel="0.4.9",
        flashinfer="0.7.1",
        deep_gemm="0.2.2",
        mooncake_package="mooncake-transfer-engine-cuda13",
        mooncake_version="0.3.13.post1",
        min_driver_branch=580,
    ),
    zmq_peer_allow_list=False,  # came in 0.5.23
)
