"""Calibration finds the efficiency factors behind a bench run: records made by the model at
known factors (and a sim speed) are fitted back to those factors, the store keeps one entry per
model and GPU, and a run it cannot use is refused with the fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kit.bench.records import RequestRecord, write_records
from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.timing import Efficiency
from kit.sizing.calibration import (
    BenchRun,
    Calibration,
    fit,
    load,
    predicted_goodput,
    read_run,
    save,
    store_path,
    usable,
    with_efficiency,
)
from kit.sizing.problem import SizingError
from kit.topology.schema import SLO
from tests.support.sizing_cases import synthetic_records

TRUE = Efficiency(compute=0.45, memory=0.55)
SLO_WALL = SLO(ttft_ms=1600, tpot_ms=160, attainment=0.9)  # 400/40 ms at speed 0.25
SPEED = 0.25


def two_p_one_d() -> Cluster:
    config = InstanceConfig(resolve_model("meta-llama/Llama-2-13b-hf"), gpu_spec("A100-80G"))
    return Cluster(prefill=Instances(config, 2), decode=Instances(config, 1))


def write_run(folder: Path, records: list[RequestRecord], goodput: float | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_records(folder / "requests.jsonl", records)
    summary: dict[str, object] = {"slo": SLO_WALL.model_dump(), "points": []}
    if goodput is not None:
        summary["search"] = {"goodput": goodput, "capped": ""}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_the_fit_finds_the_factors_a_run_was_made_with(tmp_path):
    measured_on = with_efficiency(two_p_one_d(), TRUE)
    folder = write_run(tmp_path / "run", synthetic_records(measured_on, [1.0, 2.0, 3.0], SPEED))
    run = read_run(folder)
    assert [p.rate for p in run.points] == [1.0, 2.0, 3.0]
    result = fit(two_p_one_d(), SPEED, usable(run))
    assert result.after.compute == pytest.approx(TRUE.compute, rel=0.05)
    assert result.after.memory == pytest.approx(TRUE.memory, rel=0.05)
    assert result.error_before > 0.15
    assert result.error_after < 0.03


def test_the_predicted_goodput_moves_toward_the_run_after_the_fit(tmp_path):
    measured_on = with_efficiency(two_p_one_d(), TRUE)
    records = synthetic_records(measured_on, [2.0], SPEED)
    run = read_run(write_run(tmp_path / "run", records))
    truth = predicted_goodput(measured_on, SPEED, run, TRUE)
    before = predicted_goodput(two_p_one_d(), SPEED, run, Efficiency())
    after = predicted_goodput(two_p_one_d(), SPEED, run, replace(TRUE, compute=0.46))
    assert before > truth * 1.15  # the defaults are faster than the GPUs that made the run
    assert abs(after - truth) < abs(before - truth)


def test_points_where_most_requests_missed_are_left_out(tmp_path):
    run = BenchRun(tmp_path, (), SLO_WALL, None)
    with pytest.raises(SizingError, match="nothing the model should match"):
        fit(two_p_one_d(), SPEED, usable(run))


def test_the_store_keeps_one_calibration_per_model_and_gpu(tmp_path):
    path = tmp_path / "store" / "calibration.json"
    first = Calibration("Llama-2-13B", "A100-80G", 0.5, 0.6, "runs/a", "2026-01-01", 0.2, 0.05)
    other = replace(first, gpu="H100-SXM")
    save(first, path)
    save(other, path)
    save(replace(first, compute=0.55, run="runs/b"), path)
    assert load("Llama-2-13B", "A100-80G", path) == replace(first, compute=0.55, run="runs/b")
    assert load("Llama-2-13B", "H100-SXM", path) == other
    assert load("Llama-2-13B", "L40S", path) is None
    assert len(json.loads(path.read_text())["calibrations"]) == 2


def test_a_store_that_is_not_one_says_how_to_fix_it(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text("[1, 2]")
    with pytest.raises(SizingError, match=r"not a pdkit calibration file .* To fix: remove it"):
        load("m", "g", path)


def test_the_store_path_follows_the_environment(tmp_path):
    assert store_path({"PDKIT_CALIBRATION": str(tmp_path / "c.json")}) == tmp_path / "c.json"
    assert store_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "pdkit/calibration.json"


def test_a_folder_without_a_run_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SizingError, match=r"no summary.json\. To fix: give the --out folder"):
        read_run(tmp_path)


def test_a_closed_loop_run_is_refused(tmp_path):
    records = [
        RequestRecord(index=i, rate=None, warmup=False, input_tokens=8, output_tokens=8)
        for i in range(3)
    ]
    with pytest.raises(SizingError, match="no load point at a rate"):
        read_run(write_run(tmp_path / "run", records))
