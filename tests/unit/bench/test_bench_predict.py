"""What `pdkit bench` predicts for a deployment: the modelled GPU is the hosts' `gpu_type`
whatever the engine (a real SGLang deployment on A100s is modelled on A100s)."""

from __future__ import annotations

import json
import os

import yaml

from kit.bench.predict import plan_cluster
from kit.bench.records import write_records
from kit.plan.resolve import resolve
from kit.sizing.calibration import CALIBRATION_ENV
from tests.conftest import REPO, run_pdkit
from tests.support.sizing_cases import synthetic_records


def a100_sglang_topology(tmp_path):
    """topologies/local.yaml on A100-80G hosts with the real engine."""
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    data["engine"] = "sglang"
    data["model"]["path"] = "meta-llama/Llama-2-13b-hf"
    data["hosts"][0]["gpu_type"] = "A100-80G"
    data["decode"].pop("args")
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_prediction_for_engine_sglang_models_the_hosts_gpu(tmp_path):
    cluster, speed = plan_cluster(resolve(a100_sglang_topology(tmp_path)))
    assert speed == 1.0
    assert cluster.prefill is not None and cluster.decode is not None
    assert cluster.prefill.config.gpu.name == "A100-80G"
    assert cluster.decode.config.gpu.name == "A100-80G"


def test_calibration_for_engine_sglang_is_stored_for_the_hosts_gpu(tmp_path):
    topology = a100_sglang_topology(tmp_path)
    cluster, speed = plan_cluster(resolve(topology))
    run = tmp_path / "run"
    run.mkdir()
    write_records(run / "requests.jsonl", synthetic_records(cluster, [1, 2], speed))
    summary = {"slo": {"ttft_ms": 400, "tpot_ms": 40, "attainment": 0.9}}
    (run / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "hf").mkdir()
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        CALIBRATION_ENV: str(tmp_path / "calibration.json"),
    }
    fitted = run_pdkit("size", str(topology), "--calibrate", str(run), env=env)
    assert fitted.returncode == 0, fitted.stderr
    assert "Llama-2-13B on A100-80G" in fitted.stdout
    (entry,) = json.loads((tmp_path / "calibration.json").read_text())["calibrations"]
    assert entry["gpu"] == "A100-80G"


def test_prediction_counts_pipeline_stages_in_each_instances_gpus(tmp_path):
    """A prefill of pp 2 holds two GPUs: the modelled cluster has 2 x 2 + 1 of them (it
    counted 1 per prefill before the launch record carried pp)."""
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    data["hosts"][0]["gpus"] = 5
    data["prefill"]["pp"] = 2
    path = tmp_path / "pp.yaml"
    path.write_text(yaml.safe_dump(data))
    cluster, _ = plan_cluster(resolve(path))
    assert cluster.prefill is not None and cluster.prefill.config.pp == 2
    assert cluster.prefill.config.gpus == 2
    assert cluster.gpus == 5
