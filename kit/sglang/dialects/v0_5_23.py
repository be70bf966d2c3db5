"""SGLang 0.5.23 (the default)."""

from __future__ import annotations

from kit.sglang.dialects.base import Dialect, Packages
from kit.sglang.startup import v0_5_23

DIALECT = Dialect(
    version="0.5.23",
    startup_rules=v0_5_23.RULES,
    packages=Packages(
        torch="2.14.1",
        cuda="13",
        sglang_kernel="0.4.10",
        flashinfer="0.7.2",
        deep_gemm="0.2.3.post2",
        mooncake_package="mooncake-transfer-engine-cuda13",
        mooncake_version="0.3.13.post1",
        min_driver_branch=580,
    ),
    notes=(
        "the switches whose default goes from false to None let SGLang decide per model; each "
        "has a --no- form to keep it off.",
    ),
)
