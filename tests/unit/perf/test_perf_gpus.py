"""The GPU table: names, aliases, and what an unknown name gets told."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit.perf.gpus import GPU_ALIASES, GPUS, UnknownGpuError, gpu_spec
from tests.conftest import REPO


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


def test_the_h200s_measured_memory_efficiency_is_what_its_shipped_timings_fit(tmp_path):
    # The fitter is run as a user runs it: tests never import tools/.
    out = tmp_path / "fit.json"
    data = REPO / "benchmarks" / "data" / "h200-calibration.json"
    result = subprocess.run(
        [sys.executable, "-m", "tools.fit_perf", str(data), "--gpu", "H200", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    fitted = json.loads(out.read_text())["fit"]
    assert gpu_spec("H200").memory_efficiency == round(fitted["memory"], 2)
    assert "H200" in gpu_spec("H200").measured
