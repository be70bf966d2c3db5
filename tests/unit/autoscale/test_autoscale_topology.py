"""`autoscale:` in a topology: its checks name the key and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kit.errors import Problem
from kit.topology.autoscale_checks import autoscale_problems, role_bounds
from kit.topology.schema import Topology
from kit.topology.validate import validate
from tests.conftest import base_topology


def topology(prefills: int = 2, decodes: int = 2, **autoscale: object) -> Topology:
    data = base_topology()
    data["prefill"] = {"count": prefills, "tp": 2, "hosts": ["a"]}
    data["decode"] = {"count": decodes, "tp": 2, "hosts": ["b"]}
    data["autoscale"] = dict(autoscale)
    return Topology.model_validate(data)


def problems(t: Topology) -> list[Problem]:
    return list(autoscale_problems(t))


def test_defaults_are_valid_and_bounds_resolve_from_the_pool():
    t = topology(3, 3)
    assert problems(t) == []
    assert [p for p in validate(t) if p.path[0] == "autoscale"] == []
    assert role_bounds(t, "prefill") == (1, 5)
    assert role_bounds(t, "decode") == (1, 5)


def test_instances_of_different_sizes_cannot_trade_roles():
    data = base_topology()  # prefill tp 2, decode tp 4
    data["autoscale"] = {}
    found = problems(Topology.model_validate(data))
    assert found[0].key == "autoscale"
    assert "prefill instances use 2 GPU(s) each and decode instances 4" in found[0].message
    assert "same tp, dp, ep and pp" in found[0].fix


def test_mins_larger_than_the_pool():
    found = problems(topology(1, 1, prefill={"min": 1}, decode={"min": 2}))
    assert found[0].key == "autoscale.prefill.min"
    assert "more than the pool's 2 instance(s)" in found[0].message


def test_max_below_min():
    found = problems(topology(3, 3, decode={"min": 3, "max": 2}))
    assert found[0].key == "autoscale.decode.max"
    assert found[0].fix == "set autoscale.decode.max to at least 3."


def test_max_that_would_starve_the_other_role():
    found = problems(topology(3, 3, prefill={"max": 6}))
    assert found[0].key == "autoscale.prefill.max"
    assert found[0].fix == "set autoscale.prefill.max to at most 5."


def test_a_count_outside_the_bounds():
    found = problems(topology(1, 5, prefill={"min": 2}))
    assert found[0].key == "prefill.count"
    assert "outside autoscale.prefill's bounds [2, 5]" in found[0].message


@pytest.mark.parametrize(
    ("key", "value"),
    [("interval_s", 0), ("hysteresis", 2), ("max_step", 0), ("prediction_error", 0)],
)
def test_shape_errors_name_the_key(key, value):
    with pytest.raises(ValidationError, match=key):
        topology(**{key: value})


def test_off_unless_set():
    t = Topology.model_validate(base_topology())
    assert t.autoscale is None and problems(t) == []
