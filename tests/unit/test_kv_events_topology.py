"""`<role>.kv_events`: rendered as SGLang's --kv-events-config with ports placed per host and
DP rank, listed in the Plan; the mistakes that would publish nothing are refused."""

from __future__ import annotations

import json

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import base_topology


def config_of(argv: tuple[str, ...]) -> dict:
    return json.loads(argv[argv.index("--kv-events-config") + 1])


def test_each_prefill_publishes_on_its_own_ports_one_per_dp_rank(write_topology):
    data = base_topology()
    data["prefill"] |= {"dp": 2, "kv_events": {"port": 6000, "topic": "cache"}}
    data["router"]["prefill_policy"] = "cache_aware"
    plan = resolve(write_topology(data))
    prefills = [w for w in plan.workers if w.role == "prefill"]
    endpoints = [config_of(w.command.args)["endpoint"] for w in prefills]
    assert endpoints == ["tcp://*:6000", "tcp://*:6002"]  # instance 1 after instance 0's ranks
    assert {config_of(w.command.args)["topic"] for w in prefills} == {"cache"}
    used = [[(p.first, p.last) for p in w.ports if p.what == "KV events"] for w in prefills]
    assert used == [[(6000, 6001)], [(6002, 6003)]]
    decode = next(w for w in plan.workers if w.role == "decode")
    assert "--kv-events-config" not in decode.command.args


def refusal(write_topology, data) -> list[str]:
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    return [str(p) for p in info.value.problems]


def test_cache_aware_without_prefill_events_is_refused_with_the_fix(write_topology):
    data = base_topology()
    data["router"]["prefill_policy"] = "cache_aware"
    (problem,) = refusal(write_topology, data)
    assert "router.prefill_policy" in problem and "kv_events: {}" in problem


def test_a_decode_without_its_radix_cache_or_a_disabled_cache_publishes_nothing(write_topology):
    data = base_topology()
    data["decode"]["kv_events"] = {}
    data["prefill"] |= {"kv_events": {}, "args": {"disable-radix-cache": True}}
    problems = refusal(write_topology, data)
    assert any("decode.kv_events" in p and "enable-radix-cache" in p for p in problems)
    assert any("prefill.kv_events" in p and "disable-radix-cache" in p for p in problems)


def test_the_flag_itself_is_pdkits(write_topology):
    data = base_topology()
    data["prefill"]["args"] = {"kv-events-config": '{"publisher": "zmq"}'}
    (problem,) = refusal(write_topology, data)
    assert "prefill.kv_events" in problem
