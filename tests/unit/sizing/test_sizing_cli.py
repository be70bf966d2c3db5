"""`pdkit size` as a user runs it: what it prints and writes for DistServe's question, the
loop through --calibrate into the next sizing, and bad options refused with the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from kit.bench.predict import plan_cluster
from kit.bench.records import write_records
from kit.bench.run import deployment_json
from kit.perf.timing import Efficiency
from kit.plan.resolve import resolve
from kit.sizing.calibration import CALIBRATION_ENV, with_efficiency
from kit.sizing.command import SizeArgs, build_problem
from kit.sizing.problem import SizingError
from tests.conftest import REPO, run_pdkit
from tests.support.sizing_cases import synthetic_records

LOCAL = str(REPO / "topologies" / "local.yaml")
DISTSERVE = [
    "--model",
    "meta-llama/Llama-2-13b-hf",
    "--gpu",
    "A100-80G",
    "--gpus",
    "3",
    "--input-len",
    "512",
    "--output-len",
    "64",
    "--ttft-ms",
    "400",
    "--tpot-ms",
    "40",
]


def env_for(tmp_path):
    (tmp_path / "hf").mkdir(exist_ok=True)
    return {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        CALIBRATION_ENV: str(tmp_path / "calibration.json"),
    }


def test_size_prints_the_ranking_and_writes_a_topology_the_validator_accepts(tmp_path):
    emitted, out = tmp_path / "out.yaml", tmp_path / "size"
    result = run_pdkit(
        "size", *DISTSERVE, "--emit", str(emitted), "--out", str(out), env=env_for(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first_row = next(line for line in lines if line.strip().startswith("1 "))
    assert "2P1D (P tp1, D tp1)" in first_row
    assert any(line.startswith("PD against colocated: 2P1D") for line in lines)
    assert any(line.startswith("Robustness of 2P1D") for line in lines)
    default = Efficiency()
    assert f"efficiency: compute {default.compute:g}, memory {default.memory:g}" in result.stdout
    assert run_pdkit("validate", str(emitted)).returncode == 0
    text = emitted.read_text()
    assert text.startswith("# Sized by `pdkit size`")
    assert "The hosts are placeholders" in text
    data = yaml.safe_load(text)
    assert (data["prefill"]["count"], data["decode"]["count"]) == (2, 1)
    summary = json.loads((out / "size.json").read_text())
    assert summary["best"]["label"] == "2P1D (P tp1, D tp1)"
    assert summary["best_colocated"]["kind"] == "colocated"
    assert (out / "pareto.png").read_bytes().startswith(b"\x89PNG")


def test_size_json_is_machine_readable(tmp_path):
    result = run_pdkit("size", *DISTSERVE, "--no-robustness", "--json", env=env_for(tmp_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["best"]["kind"] == "pd"
    assert data["best"]["gpus"] == 3
    assert data["efficiency"]["compute"] == Efficiency().compute


def test_calibrate_fits_a_run_and_the_next_size_uses_it(tmp_path):
    topology = tmp_path / "deployed.yaml"
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    data["model"]["path"] = "meta-llama/Llama-2-13b-hf"
    data["hosts"][0]["gpu_type"] = "A100-80G"
    data["defaults"]["env"] = {"PDKIT_SIM_SPEED": "0.25"}
    data["decode"].pop("args")
    data["slo"] = {"ttft_ms": 1600, "tpot_ms": 160}
    topology.write_text(yaml.safe_dump(data))
    cluster, speed = plan_cluster(resolve(topology))
    records = synthetic_records(with_efficiency(cluster, Efficiency(0.45, 0.55)), [1, 2], speed)
    run = tmp_path / "run"
    run.mkdir()
    write_records(run / "requests.jsonl", records)
    (run / "summary.json").write_text(json.dumps({"slo": data["slo"] | {"attainment": 0.9}}))
    env = env_for(tmp_path)

    fitted = run_pdkit("size", str(topology), "--calibrate", str(run), env=env)
    assert fitted.returncode == 0, fitted.stderr
    assert "note: the run does not record what it measured" in fitted.stdout
    assert "PDKIT_SIM_SPEED 0.25" in fitted.stdout
    assert "after: compute 0.4" in fitted.stdout
    store = json.loads((tmp_path / "calibration.json").read_text())
    (entry,) = store["calibrations"]
    assert (entry["model"], entry["gpu"]) == ("Llama-2-13B", "A100-80G")
    assert entry["error_after"] < entry["error_before"]

    sized = run_pdkit("size", str(topology), "--no-robustness", env=env)
    assert sized.returncode == 0, sized.stderr
    assert f"calibrated on {run}" in sized.stdout
    assert "sim slowed by PDKIT_SIM_SPEED 0.25" in sized.stdout
    ignored = run_pdkit("size", str(topology), "--no-robustness", "--no-calibration", env=env)
    assert "stored calibrations ignored" in ignored.stdout


def test_calibrate_refuses_a_run_of_another_deployment(tmp_path):
    """bench records what it measured in summary.json; --calibrate with another topology is
    refused, naming what differs, and with the same one it fits without a note."""
    topology = tmp_path / "deployed.yaml"
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    data["model"]["path"] = "meta-llama/Llama-2-13b-hf"
    data["hosts"][0]["gpu_type"] = "A100-80G"
    data["decode"].pop("args")
    topology.write_text(yaml.safe_dump(data))
    plan = resolve(topology)
    cluster, speed = plan_cluster(plan)
    run = tmp_path / "run"
    run.mkdir()
    write_records(run / "requests.jsonl", synthetic_records(cluster, [1, 2], speed))
    summary = {"slo": {"ttft_ms": 400, "tpot_ms": 40, "attainment": 0.9}}
    (run / "summary.json").write_text(json.dumps(summary | {"deployment": deployment_json(plan)}))
    env = env_for(tmp_path)
    same = run_pdkit("size", str(topology), "--calibrate", str(run), env=env)
    assert same.returncode == 0, same.stderr
    assert "note: the run does not record" not in same.stdout

    data["decode"]["count"], data["prefill"]["tp"] = 2, 2
    data["hosts"][0]["gpus"] = 6
    topology.write_text(yaml.safe_dump(data))
    other = run_pdkit("size", str(topology), "--calibrate", str(run), env=env)
    assert other.returncode != 0
    assert f"--calibrate {run}: the run measured another deployment than {topology}" in (
        other.stderr
    )
    assert "prefill tp 1 -> 2; decode instances 1 -> 2" in other.stderr
    assert f"pdkit bench {topology} --search --out DIR" in other.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --model, --gpu, --gpus (or a topology"),
        (["--model", "x", "--gpu", "A100-80G"], "give --gpus"),
        (["--model", "x", "--gpu", "Z9000", "--gpus", "2"], "'Z9000' is not a GPU"),
        ([LOCAL, "--gpus", "4"], "--gpus sizes generic hosts"),
        ([LOCAL, "--gpu", "A100-80G"], "--gpu A100-80G but the topology's hosts have gpu_type"),
        ([*DISTSERVE, "--input-len", "many"], "--input-len 'many' is not a length"),
        ([*DISTSERVE, "--target-rate", "0"], "--target-rate must be above 0"),
        ([*DISTSERVE, "--trace", "/no/trace.jsonl"], "--trace /no/trace.jsonl: cannot read"),
        (["--calibrate", "/no/run"], "--calibrate RUN_DIR needs the topology the run measured"),
        ([LOCAL, "--calibrate", "/no/run"], "--calibrate /no/run: no summary.json"),
        (["/no/topology.yaml"], "cannot read the file"),
    ],
)
def test_bad_options_are_refused_with_the_fix(tmp_path, args, message):
    result = run_pdkit("size", *args, env=env_for(tmp_path))
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_model_memory_that_fits_nowhere_is_explained(tmp_path):
    args = ["--model", "deepseek-ai/DeepSeek-V3", "--gpu", "L40S", "--gpus", "4"]
    result = run_pdkit("size", *args, env=env_for(tmp_path))
    assert result.returncode == 1
    assert "fits on no TP size of L40S" in result.stderr
    assert "To fix:" in result.stderr


def test_size_predicts_the_ttft_a_kv_pool_gives_a_shared_prefix_workload(tmp_path):
    pool = str(REPO / "topologies" / "local-kvpool.yaml")
    args = ["--prefix-share", "0.9", "--prefix-groups", "41", "--input-len", "4096",
            "--output-len", "16", "--requests", "120", "--no-robustness"]  # fmt: skip
    result = run_pdkit("size", pool, *args, "--json", env=env_for(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["prefix_caching"]
    alone, pooled = report["without_pool"], report["with_pool"]
    assert report["prefills"] == 2 and pooled["pool_hit_rate"] > 0
    # The second prefill loads each group's prefix instead of computing it: a lower TTFT.
    assert pooled["ttft_p50_ms"] < alone["ttft_p50_ms"]
    assert pooled["ttft_p90_ms"] < alone["ttft_p90_ms"]
    printed = run_pdkit("size", pool, *args, env=env_for(tmp_path))
    assert f"at {report['rate']:g} req/s: TTFT p50 {alone['ttft_p50_ms']:.0f} ms" in printed.stdout
    # The same sim slowed to half speed serves less (the model meets a halved SLO at full
    # speed) and each request takes longer in wall time (wall = model time / speed): its
    # predicted TTFT is longer, not shorter.
    data = yaml.safe_load(Path(pool).read_text())
    data.setdefault("defaults", {}).setdefault("env", {})["PDKIT_SIM_SPEED"] = "0.5"
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(data, sort_keys=False))
    halved = run_pdkit("size", str(slow), *args, "--json", env=env_for(tmp_path))
    assert halved.returncode == 0, halved.stderr
    half = json.loads(halved.stdout)["prefix_caching"]
    assert half["rate"] < report["rate"] / 2
    assert half["with_pool"]["ttft_p50_ms"] > 1.2 * pooled["ttft_p50_ms"], (half, report)


def test_a_slurm_topology_is_refused_with_the_generic_hosts_of_its_shape():
    """A Slurm topology has no hosts: section (its nodes come from the allocation): `pdkit size`
    says so and gives the generic-hosts command of the allocation's shape, not a traceback."""
    with pytest.raises(SizingError) as refused:
        build_problem(SizeArgs(topology=REPO / "topologies" / "local-slurm.yaml"))
    text = str(refused.value)
    assert "launcher: slurm" in text and "no hosts: section" in text
    assert "--gpus 6 --gpus-per-host 2" in text  # 3 nodes x 2 GPUs
