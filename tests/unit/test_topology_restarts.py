"""A role whose only instance spans several nodes has no worker while its rank group restarts:
`pdkit validate` warns when pdkit's figure for that restart outlasts the router's hold, and
`--strict` refuses it."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from kit.cli import app
from kit.errors import TopologyError
from kit.plan.resolve import warnings
from kit.topology.restarts import EXPECTED_S, MARGIN, UNPLANNED, expected_away_s
from tests.conftest import REPO, base_topology

AWAY_S = expected_away_s("sglang", UNPLANNED)


def spanning_decode(count: int = 1, tp: int = 16) -> dict:
    """`base_topology` with `count` decodes of `tp` GPUs on 8-GPU hosts b0, b1, ..."""
    data = base_topology()
    template = data["hosts"][1]
    nodes = count * max(1, tp // 8)
    data["hosts"][1:] = [
        {**template, "name": f"b{i}", "address": f"10.0.0.{i + 2}"} for i in range(nodes)
    ]
    data["decode"] = {"count": count, "tp": tp, "hosts": [f"b{i}" for i in range(nodes)]}
    return data


def decode_warnings(write_topology, data: dict) -> list[str]:
    return [str(w) for w in warnings(write_topology(data)) if w.path == ("decode",)]


def test_a_lone_decode_over_two_nodes_warns_on_its_key_with_the_fix(write_topology):
    path = write_topology(spanning_decode())
    (found,) = warnings(path)
    assert found.path == ("decode",)
    key_line = path.read_text().splitlines().index("decode:") + 1
    assert (found.file, found.line, found.column) == (str(path), key_line, 1)
    assert "decode: its only instance spans 2 nodes; when one rank dies" in str(found)
    assert f"(about {AWAY_S:.0f} s for sglang, pdkit's figure)" in found.message
    assert "router's hold (5 s, router.faults.hold_timeout_s)" in found.message
    assert found.fix == (
        f"set decode.count: 2 (the other serves meanwhile), or router.faults.hold_timeout_s: "
        f"{AWAY_S:.0f} or more."
    )


def test_no_warning_for_two_instances_a_single_node_one_or_a_long_enough_hold(write_topology):
    assert decode_warnings(write_topology, spanning_decode(count=2)) == []
    assert decode_warnings(write_topology, spanning_decode(tp=8)) == []
    data = spanning_decode()
    data["router"]["faults"] = {"hold_timeout_s": AWAY_S}
    assert decode_warnings(write_topology, data) == []
    data["router"]["faults"] = {"hold_timeout_s": AWAY_S - 1}
    assert len(decode_warnings(write_topology, data)) == 1


def test_smg_holds_nothing_so_the_fix_names_pdkits_router(write_topology):
    data = spanning_decode()
    data["router"] = {"host": "a", "kind": "smg", "faults": {"hold_timeout_s": 600}}
    (found,) = decode_warnings(write_topology, data)
    assert "router's hold (none: smg holds no request)" in found
    assert "router.kind: pdkit with router.faults.hold_timeout_s" in found


def test_a_slurm_job_step_restarts_as_one_group_too(write_topology):
    """A multi-node instance is one job step, started again as a whole (kit/slurm/script.py)."""
    data = yaml.safe_load((REPO / "topologies" / "local-slurm.yaml").read_text())
    data["router"]["faults"]["hold_timeout_s"] = 5
    path = write_topology(data, name="local-slurm.yaml")  # its venv and root stay relative
    (found,) = warnings(path)
    assert found.path == ("decode",)
    assert f"(about {expected_away_s('sim', UNPLANNED):.0f} s for sim" in found.message


def test_validate_prints_it_and_strict_refuses_it(write_topology):
    path = str(write_topology(spanning_decode()))
    runner = CliRunner()
    shown = runner.invoke(app, ["validate", path])
    assert shown.exit_code == 0, shown.output
    assert "OK" in shown.stdout
    assert "warning:" in shown.stderr and "decode: its only instance spans 2 nodes" in shown.stderr
    strict = runner.invoke(app, ["validate", path, "--strict"])
    assert strict.exit_code == 1
    assert isinstance(strict.exception, TopologyError)
    assert [p.path for p in strict.exception.problems] == [("decode",)]


def test_up_prints_it_before_it_deploys(write_topology, tmp_path):
    """A user who deploys without validating sees it too (`--diff`: nothing is changed)."""
    path = str(write_topology(spanning_decode()))
    shown = CliRunner().invoke(app, ["up", path, "--diff", "--state-dir", str(tmp_path / "st")])
    assert shown.exit_code == 0, shown.output
    assert "warning:" in shown.stderr and "decode: its only instance spans 2 nodes" in shown.stderr
    assert "Nothing was changed (--diff)." in shown.stdout


def test_the_figure_is_the_replacement_without_its_stop():
    """Start, gate and readmission with the margin, as `pdkit restart` counts them: nothing is
    drained or stopped first when a rank died."""
    for engine, phases in EXPECTED_S.items():
        assert expected_away_s(engine) - expected_away_s(engine, UNPLANNED) == pytest.approx(
            phases["stop"] * MARGIN
        )
