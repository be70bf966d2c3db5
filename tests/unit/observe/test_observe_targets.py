"""Probe targets come from the Plan: one per worker process (an instance's rank 0, and its other
nodes, which serve /health and /metrics), with what the topology expects."""

from __future__ import annotations

from kit.observe.targets import targets_from_plan
from kit.plan.resolve import resolve
from tests.conftest import REPO

TOPOLOGIES = REPO / "topologies"


def test_smg_workers_and_the_router_with_its_separate_metrics_port(monkeypatch):
    monkeypatch.setenv("PDKIT_API_KEY", " secret\n")
    plan = resolve(TOPOLOGIES / "qwen3-2p1d-nicmap.yaml")
    targets = targets_from_plan(plan)
    assert [(t.name, t.url) for t in targets.workers] == [(w.name, w.url) for w in plan.workers]
    prefill, decode = targets.workers[0].expected, targets.workers[2].expected
    assert (prefill.mode, prefill.bootstrap_port, prefill.tp_size) == ("prefill", 8998, 4)
    assert (decode.mode, decode.bootstrap_port, decode.tp_size) == ("decode", None, 8)
    assert prefill.served_model == plan.model.served_name
    assert targets.router.url == plan.router.url
    assert targets.router.metrics_url == f"http://10.0.2.1:{plan.router.metrics_port}/metrics"
    assert targets.router.api_key == "secret"  # as `pdkit up` reads it: stripped


def test_every_node_of_a_multi_node_instance_is_a_target_rank_0_named_as_the_instance():
    plan = resolve(TOPOLOGIES / "deepseek-v3-2p2d.yaml")
    targets = targets_from_plan(plan)
    assert [(t.name, t.url, t.nnodes, t.node_rank) for t in targets.workers] == [
        (w.instance_name if w.node_rank == 0 else w.name, w.url, 2, w.node_rank)
        for w in plan.workers
    ]
    assert [t.name for t in targets.workers if t.follower] == ["prefill-0-node1", "decode-0-node1"]
    assert targets.router.metrics_url == f"{plan.router.url}/metrics"  # pdkit: one port
