"""The GPU table: names, aliases, and what an unknown name gets told."""

from __future__ import annotations

import pytest

from kit.perf.gpus import GPU_ALIASES, GPUS, UnknownGpuError, gpu_spec


def test_gpu_names_and_aliases_ignore_case():
    assert gpu_spec("h100").name == "H100-SXM"
    assert gpu_spec("A100").name == "A100-80G"
    assert gpu_spec(" h200-141g ").name == "H200"


def test_every_alias_names_a_gpu_in_the_table():
    assert [alias for alias, target in GPU_ALIASES.items() if target not in GPUS] == []


def test_an_unknown_gpu_is_told_the_known_ones():
    with pytest.raises(UnknownGpuError, match=r"V100.*A100-80G, .*L40S"):
        gpu_spec("V100")


def test_fp8_weights_use_fp8_peak_only_where_the_gpu_has_it():
    assert gpu_spec("H100").flops(1.0) > 1.9 * gpu_spec("H100").flops(2.0)
    assert gpu_spec("A100").flops(1.0) == gpu_spec("A100").flops(2.0)
