"""`transfer.timeouts`: SGLang's PD handoff timeouts in every worker's env (a role's env wins),
and the routers' own timeouts that follow them."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import REPO, base_topology

DEFAULTS = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "300",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "300",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "5",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}


def _pd_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("SGLANG_DISAGGREGATION_")}


def _flag(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_every_worker_says_which_pd_timeouts_are_in_force(write_topology):
    plan = resolve(write_topology(base_topology()))
    for w in plan.workers:
        assert _pd_env(w.env) == DEFAULTS, w.name
    # At SGLang's defaults the router keeps its own: nothing rendered.
    assert "--prefill-timeout" not in plan.router.command.args
    assert "--request-timeout" not in plan.router.command.args


def test_topology_timeouts_reach_the_workers_and_the_router_follows(write_topology):
    data = base_topology()
    data["transfer"]["timeouts"] = {
        "bootstrap_timeout_s": 2000,
        "waiting_timeout_s": 1800,
        "heartbeat_interval_s": 3,
        "heartbeat_max_failures": 4,
    }
    data["decode"]["env"] = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2500"}  # env wins
    plan = resolve(write_topology(data))
    (decode,) = plan.role("decode")
    assert _pd_env(decode.env) == {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2000",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "2500",
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "3",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "4",
    }
    prefill = plan.role("prefill")[0]
    assert prefill.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "1800"
    # The prefill leg and the whole request may last the prefill's bootstrap wait plus the
    # decode's waiting one (the value in force, from the decode's env).
    args = plan.router.command.args
    assert _flag(args, "--prefill-timeout") == "4500"
    assert _flag(args, "--request-timeout") == "4500"


def test_smg_request_timeout_follows_a_long_handoff(write_topology):
    data = base_topology()
    data["router"]["kind"] = "smg"
    assert "--request-timeout-secs" not in resolve(write_topology(data)).router.command.args
    data["transfer"]["timeouts"] = {"bootstrap_timeout_s": 1000, "waiting_timeout_s": 1000}
    args = resolve(write_topology(data)).router.command.args
    assert _flag(args, "--request-timeout-secs") == "2000"


def test_the_large_scale_example_sets_its_timeouts_in_the_topology():
    plan = resolve(REPO / "topologies" / "deepseek-r1-ep.yaml")
    for w in plan.workers:
        assert w.env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "100000"
        assert w.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "100000"
    assert _flag(plan.router.command.args, "--prefill-timeout") == "200000"


def test_a_heartbeat_below_sglangs_floor_is_refused(write_topology):
    data = base_topology()
    data["transfer"]["timeouts"] = {"heartbeat_interval_s": 1}
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    assert "transfer.timeouts.heartbeat_interval_s" in str(info.value)


def test_an_env_timeout_sglang_cannot_parse_names_the_setting(write_topology):
    data = base_topology()
    data["prefill"]["env"] = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "5m"}
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    (problem,) = info.value.problems
    assert problem.key == "prefill.env.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
    assert "transfer.timeouts.bootstrap_timeout_s" in problem.fix
