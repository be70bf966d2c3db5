"""Replacing a role's only instance (kit.deploy.surge): a stand-in on free GPUs when one more
instance fits, else the router's hold when the instance starts within it, else a refusal that
names the gap (or, with --force, the gap taken)."""

from __future__ import annotations

import pytest
import yaml

from kit.deploy.changes import diff, only_instances
from kit.deploy.state import build_record, load_starts, load_windows, save_starts, save_windows
from kit.deploy.surge import decide, stand_in, start_estimate
from kit.hosts.inventory import deploy_hosts
from kit.plan.resolve import resolve, resolve_surge
from kit.topology.restarts import EXPECTED_S
from tests.conftest import REPO

PYTHON = "/venv/bin/python"


@pytest.fixture
def local(tmp_path):
    """A function: local.yaml with `gpus` GPUs -> (record, surge record or why none) for a
    surge of `role`."""
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())

    def build(gpus, role="decode", hold=None):
        data["hosts"][0]["gpus"] = gpus
        if hold is not None:
            data["router"]["faults"] = {"hold_timeout_s": hold}
        path = tmp_path / "local.yaml"
        path.write_text(yaml.safe_dump(data))
        plan = resolve(path)
        record = build_record(plan, deploy_hosts(plan, PYTHON), "t1")
        surge = resolve_surge(path, role)
        if isinstance(surge, str):
            return plan, record, surge
        return plan, record, build_record(surge, deploy_hosts(surge, PYTHON), "t1")

    return build


def _restart(record, instance):
    (step,) = only_instances(diff(record, record, restart=[instance]), record)
    return step


def test_a_free_gpu_gives_the_only_decode_a_stand_in_on_it(local):
    # 4 GPUs, 2P1D: prefills on 0 and 1, decode-0 on 3; GPU 2 is free.
    _, record, surge = local(4)
    processes, why = stand_in(surge, record, record)
    assert why == ""
    (stand,) = processes
    assert (stand.name, stand.gpus) == ("decode-1", (2,))
    assert stand.http_port == record.process("decode-0").http_port + 1
    cover = decide(
        _restart(record, "decode-0"),
        (processes, why),
        start_estimate("decode-0", "sim", {}),
        5.0,
        force=False,
    )
    assert not isinstance(cover, str) and cover.path == "surge"
    assert cover.line() == (
        "decode-0 is the only decode: surge: decode-1 starts first on localhost GPU 2, port "
        f"{stand.http_port} (free) and serves while decode-0 is replaced, then leaves"
    )


def test_a_stand_in_needs_its_gpus_free_of_every_running_process(local):
    _, record, surge = local(4)
    # What runs still holds GPU 2 (e.g. a decode the topology dropped, not yet removed).
    running = record.model_copy(
        update={
            "processes": (
                *record.processes,
                record.process("decode-0").model_copy(update={"name": "old", "gpus": (2,)}),
            )
        }
    )
    assert stand_in(surge, record, running) == ((), "gpu 2 on localhost is in use")


def test_without_a_free_gpu_there_is_no_stand_in_and_the_reason_says_so(local):
    _, _, why = local(3)
    assert isinstance(why, str)
    assert "decode instance 1 needs 1 GPUs" in why and why.endswith("localhost: 0 of 3")


def test_an_instance_that_starts_within_the_hold_relies_on_it(local):
    _, record, why = local(3, hold=30.0)
    step = _restart(record, "decode-0")
    estimate = start_estimate("decode-0", "sim", {"decode-0": 4.2})
    cover = decide(step, ((), why), estimate, 30.0, force=False)
    assert not isinstance(cover, str) and cover.path == "hold"
    assert "hold: it is expected back within the router's hold (30 s" in cover.line()
    assert (
        "(away 16 s: stop 3.0 s, start 4.2 s, gate 0.5 s, readmission 0.5 s: start measured on "
        "these hosts, the rest pdkit's figures for engine sim; 8.2 s x2 for load, which "
        "stretches a window)"
    ) in cover.line()


def test_the_gap_is_the_whole_replacement_not_the_start_alone(local):
    """The issue's case: a 4 s start within a 5 s hold, but stop, gate and readmission on top
    make 12 s away, and twice that for load: refused, each phase named as measured."""
    _, record, why = local(3, hold=5.0)
    step = _restart(record, "decode-0")
    window = {"stop": 2.6, "start": 4.0, "gate": 3.9, "readmit": 1.2}
    estimate = start_estimate("decode-0", "sim", {"decode-0": 9.9}, {"decode-0": [window]})
    assert estimate.seconds == pytest.approx(2 * sum(window.values()))
    refused = decide(step, ((), why), estimate, 5.0, force=False)
    assert isinstance(refused, str)
    assert refused.startswith(
        "decode-0 would leave the decodes without an instance for about 23 s (stop 2.6 s, "
        "start 4.0 s, gate 3.9 s, readmission 1.2 s: its last replacement on these hosts, "
        "measured; 11.7 s x2 for load, which stretches a window)"
    )
    assert decide(step, ((), why), estimate, 25.0, force=False).path == "hold"  # type: ignore[union-attr]
    # Within the measured window but not its margin: refused (a loaded machine stretches it).
    assert isinstance(decide(step, ((), why), estimate, 15.0, force=False), str)


def test_the_estimate_takes_the_worst_of_the_recent_windows_per_phase():
    # A quiet restart (20 s) after a loaded one (35 s): the next plan expects the loaded one.
    quiet = {"stop": 3.0, "start": 15.0, "gate": 1.0, "readmit": 1.0}
    loaded = {"stop": 6.0, "start": 26.0, "gate": 2.0, "readmit": 1.0}
    estimate = start_estimate("decode-0", "sim", {}, {"decode-0": [loaded, quiet]})
    assert estimate.seconds == pytest.approx(2 * 35.0)
    assert estimate.source == (
        "stop 6.0 s, start 26.0 s, gate 2.0 s, readmission 1.0 s: the worst of its last 2 on "
        "these hosts, measured; 35.0 s x2 for load, which stretches a window"
    )


def test_a_start_longer_than_the_hold_is_refused_naming_the_gap_unless_forced(local):
    _, record, why = local(3, hold=1.0)
    step = _restart(record, "decode-0")
    estimate = start_estimate("decode-0", "sglang", {})
    assert estimate.seconds == 2 * sum(EXPECTED_S["sglang"].values())
    refused = decide(step, ((), why), estimate, 1.0, force=False)
    assert isinstance(refused, str)
    assert refused.startswith(
        "decode-0 would leave the decodes without an instance for about 284 s (stop 10.0 s, "
        "start 110.0 s, gate 20.0 s, readmission 2.0 s: pdkit's figures for engine sglang; "
        "none measured yet; 142.0 s x2 for load, which stretches a window)"
    )
    assert "the router holds requests only 1 s" in refused
    forced = decide(step, ((), why), estimate, 1.0, force=True)
    assert not isinstance(forced, str) and forced.path == "gap"
    assert "forced: decode-0 would leave the decodes without an instance" in forced.line()


def test_smg_holds_nothing_so_without_a_stand_in_a_restart_needs_force(local):
    plan, record, why = local(3)
    assert plan.router.hold_timeout_s == 90.0  # local.yaml's
    smg = plan.router.model_copy(update={"kind": "smg", "hold_timeout_s": 0.0})
    refused = decide(
        _restart(record, "decode-0"),
        ((), why),
        start_estimate("decode-0", "sim", {"decode-0": 0.5}),
        smg.hold_timeout_s,
        force=False,
    )
    assert isinstance(refused, str)
    assert "the router holds no request (smg, or router.faults.hold_timeout_s 0)" in refused


def test_a_role_with_two_instances_needs_no_cover(local):
    _, record, _ = local(4, role="prefill")
    assert only_instances(diff(record, record, restart=["prefill-0"]), record) == []


def test_measured_starts_are_kept_per_instance_in_the_state_dir(tmp_path):
    assert load_starts(tmp_path) == {}
    save_starts(tmp_path, {"decode-0": 3.14159})
    save_starts(tmp_path, {"prefill-0": 2.0})
    assert load_starts(tmp_path) == {"decode-0": 3.14, "prefill-0": 2.0}
    (tmp_path / "starts.json").write_text("not json")
    assert load_starts(tmp_path) == {}


def test_the_recent_windows_are_kept_per_instance_and_an_older_file_still_reads(tmp_path):
    assert load_windows(tmp_path) == {}
    for start in range(1, 8):
        save_windows(tmp_path, {"decode-0": {"stop": 1.0, "start": float(start)}})
    recent = load_windows(tmp_path)["decode-0"]
    assert [w["start"] for w in recent] == [3.0, 4.0, 5.0, 6.0, 7.0]  # the last 5
    # Written by pdkit before the recent ones were kept: one window per instance.
    (tmp_path / "windows.json").write_text('{"decode-0": {"stop": 2.0, "start": 9.0}}')
    assert load_windows(tmp_path) == {"decode-0": [{"stop": 2.0, "start": 9.0}]}
