"""The emitted topology is one `pdkit validate` accepts, on the user's hosts with their NIC
maps, keeping everything but the roles and the SLO; and what it deploys is what was sized:
`pdkit bench`'s model of the emitted file runs the same instances the search served."""

from __future__ import annotations

import yaml

from kit.bench.predict import plan_cluster
from kit.perf.workload import WorkloadSpec
from kit.plan.resolve import resolve
from kit.sizing.candidates import Deployment, Group, RoleOption, instance_config
from kit.sizing.emit import render, topology_data, write
from kit.sizing.problem import load_base, make_problem
from kit.topology.schema import SLO
from tests.conftest import REPO
from tests.support.sizing_cases import distserve

NICMAP = REPO / "topologies" / "qwen3-2p1d-nicmap.yaml"


def nicmap_problem():
    base, topology = load_base(NICMAP)
    return make_problem(
        base=base,
        model_path=topology.model.path,
        gpu="H100-SXM",
        slo=SLO(ttft_ms=600, tpot_ms=30, attainment=0.95),
        workload=WorkloadSpec(),
    )


def test_the_emitted_topology_keeps_the_hosts_nic_maps_and_the_rest(tmp_path):
    problem = nicmap_problem()
    chosen = Deployment(
        prefill=Group(RoleOption(tp=2), 3),
        decode=Group(RoleOption(tp=4, max_running_requests=128), 2),
    )
    path = tmp_path / "sized.yaml"
    write(path, render(topology_data(problem, chosen), ["Sized for a test."]))
    plan = resolve(path)  # what `pdkit validate` runs
    emitted, original = yaml.safe_load(path.read_text()), yaml.safe_load(NICMAP.read_text())
    assert emitted["hosts"] == original["hosts"]
    assert emitted["hosts"][0]["gpu_nics"][5] == "mlx5_5"
    for key in ("name", "model", "defaults", "transfer", "router"):
        assert emitted[key] == original[key], key
    assert emitted["prefill"] == {"count": 3, "tp": 2}  # pins and the old chunk size dropped
    assert emitted["decode"] == {
        "count": 2,
        "tp": 4,
        "args": {"mem-fraction-static": 0.85, "max-running-requests": 128},
    }
    assert emitted["slo"] == {"ttft_ms": 600.0, "tpot_ms": 30.0, "attainment": 0.95}
    assert len(plan.role("prefill")) == 3 and len(plan.role("decode")) == 2
    assert path.read_text().startswith("# Sized for a test.\n")


def test_what_the_emitted_topology_deploys_is_what_was_sized(tmp_path):
    base, _ = load_base(REPO / "topologies" / "deepseek-v3-2p2d.yaml")
    base["model"]["path"] = "Qwen/Qwen3-30B-A3B"
    problem = make_problem(
        base=base, model_path="Qwen/Qwen3-30B-A3B", gpu="H200", slo=SLO(), workload=WorkloadSpec()
    )
    chosen = Deployment(
        prefill=Group(RoleOption(tp=8, dp=8, dp_attention=True, ep=8), 2),
        decode=Group(RoleOption(tp=4, max_running_requests=96), 4),
    )
    path = tmp_path / "moe.yaml"
    write(path, render(topology_data(problem, chosen), []))
    cluster, speed = plan_cluster(resolve(path))
    assert speed == 1
    for deployed, group, role in (
        (cluster.prefill, chosen.prefill, "prefill"),
        (cluster.decode, chosen.decode, "decode"),
    ):
        assert deployed is not None and group is not None
        sized = instance_config(problem, group.option, role)
        assert deployed.count == group.count
        for knob in (
            "tp",
            "dp",
            "dp_attention",
            "ep",
            "page_size",
            "chunked_prefill_size",
            "mem_fraction_static",
            "max_running_requests",
            "kv_dtype_bytes",
        ):
            assert getattr(deployed.config, knob) == getattr(sized, knob), (role, knob)


def test_generic_hosts_are_written_with_a_nic_per_gpu(tmp_path):
    problem = distserve(12)
    chosen = Deployment(prefill=Group(RoleOption(tp=1), 8), decode=Group(RoleOption(tp=2), 2))
    path = tmp_path / "generic.yaml"
    write(path, render(topology_data(problem, chosen), ["Placeholder hosts."]))
    plan = resolve(path)
    hosts = yaml.safe_load(path.read_text())["hosts"]
    assert [(h["name"], h["gpus"]) for h in hosts] == [("node-0", 8), ("node-1", 4)]
    assert hosts[1]["gpu_nics"] == {0: "mlx5_0", 1: "mlx5_1", 2: "mlx5_2", 3: "mlx5_3"}
    assert {w.host for w in plan.workers} == {"node-0", "node-1"}
