"""`launcher: slurm`: the allocation's nodes stand in for `hosts:`, and each mistake in `slurm:`
is refused naming its key."""

from __future__ import annotations

import pytest
import yaml

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import REPO


def slurm_topology(**slurm) -> dict:
    data = yaml.safe_load((REPO / "topologies" / "local-slurm.yaml").read_text())
    data["slurm"] = {**data["slurm"], **slurm}
    return data


def messages(write_topology, data) -> list[str]:
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    return [f"{p.key}: {p.message}" for p in info.value.problems]


def test_the_nodes_are_the_hosts_with_placeholder_addresses(write_topology):
    plan = resolve(write_topology(slurm_topology()))
    assert [(h.name, h.address, h.gpus) for h in plan.hosts] == [
        ("node0", "198.18.0.1", 2),
        ("node1", "198.18.0.2", 2),
        ("node2", "198.18.0.3", 2),
    ]
    decode = [w for w in plan.workers if w.role == "decode"]
    assert [(w.host, w.node_rank) for w in decode] == [("node1", 0), ("node2", 1)]
    assert plan.slurm is not None and plan.slurm.root.startswith("/")
    assert plan.hosts[1].root == f"{plan.slurm.root}/node1"


def test_hosts_are_refused_with_launcher_slurm(write_topology):
    data = slurm_topology()
    data["hosts"] = [{"name": "a", "address": "10.0.0.1", "gpus": 2}]
    (found,) = messages(write_topology, data)
    assert "leave `hosts:` out and set slurm.nodes" in found


def test_launcher_slurm_needs_its_section_and_the_section_needs_the_launcher(write_topology):
    data = slurm_topology()
    del data["slurm"]
    assert "needs a `slurm:` section" in messages(write_topology, data)[0]
    data = slurm_topology()
    data["launcher"] = "ansible"
    data["hosts"] = [{"name": "a", "address": "10.0.0.1", "gpus": 4}]
    assert "read only with launcher: slurm" in messages(write_topology, data)[0]


def test_a_bad_slurm_field_is_named_without_noise_about_hosts(write_topology):
    found = messages(write_topology, slurm_topology(time_limit="soon", nodes=0))
    assert len(found) == 2
    assert found[0].startswith("slurm.nodes:")
    assert found[1].startswith("slurm.time_limit:") and "D-HH:MM:SS" in found[1]


def test_the_nodelist_must_name_every_node(write_topology):
    (found,) = messages(write_topology, slurm_topology(nodelist=["n1", "n2"]))
    assert "nodelist: names 2 node(s) but nodes is 3" in found


def test_too_few_gpus_per_node_is_a_placement_problem(write_topology):
    found = messages(write_topology, slurm_topology(nodes=1))
    assert any("GPU" in m for m in found)


def test_monitoring_is_refused_with_launcher_slurm(write_topology):
    data = slurm_topology()
    data["monitoring"] = {}
    assert "monitoring: is not run by launcher: slurm" in messages(write_topology, data)[0]


def test_on_the_jobs_nodes_only_the_addresses_change():
    from kit.plan.resolve import resolve_on_nodes  # noqa: PLC0415

    path = REPO / "topologies" / "local-slurm.yaml"
    placeholder = resolve(path)
    addresses = {"node0": "10.1.0.5", "node1": "10.1.0.6", "node2": "10.1.0.7"}
    plan = resolve_on_nodes(path, addresses)
    assert [h.address for h in plan.hosts] == list(addresses.values())
    assert [(w.name, w.host, w.gpus, w.http_port) for w in plan.workers] == [
        (w.name, w.host, w.gpus, w.http_port) for w in placeholder.workers
    ]
    decode = plan.process("decode-0-node1")
    assert decode.dist_init_addr == "10.1.0.6:5500"
    assert plan.router.url == "http://10.1.0.5:8000"
