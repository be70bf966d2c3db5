"""The deployment record and the live diff: (what runs, the topology) -> the steps `pdkit up`
prints and runs, in their order, with the reasons a user reads."""

from __future__ import annotations

import json
import stat

import pytest
import yaml

from kit.deploy.changes import Step, diff, only_instances, order, waves
from kit.deploy.state import (
    DeploymentRecord,
    ProcessRecord,
    build_record,
    load_record,
    save_record,
    templates_digest,
)
from kit.errors import DeployError
from kit.hosts.inventory import deploy_hosts
from kit.plan.resolve import resolve
from tests.conftest import REPO

PYTHON = "/venv/bin/python"
TEMPLATES = "t1"


@pytest.fixture
def record_of(tmp_path):
    """A function: changes to local.yaml (5 GPUs unless told) -> the record of its Plan."""
    base = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())

    def build(prefill=2, decode=1, templates=TEMPLATES, edit=None, gpus=5):
        data = yaml.safe_load(yaml.safe_dump(base))
        data["hosts"][0]["gpus"] = gpus
        data["prefill"]["count"], data["decode"]["count"] = prefill, decode
        if edit:
            edit(data)
        path = tmp_path / "local.yaml"
        path.write_text(yaml.safe_dump(data))
        plan = resolve(path)
        return build_record(plan, deploy_hosts(plan, PYTHON), templates)

    return build


def kinds(changes):
    return [(s.kind, s.instance) for s in changes.steps]


def test_nothing_recorded_is_a_first_deployment(record_of):
    changes = diff(None, record_of())
    assert changes.first and not changes.steps
    assert changes.lines() == ["nothing recorded as running: deploy every process (first run)"]


def test_the_same_topology_changes_nothing(record_of):
    changes = diff(record_of(), record_of())
    assert changes.nothing
    assert changes.lines() == [
        "no change: every process runs with the topology's settings",
        "unchanged: prefill-0, prefill-1, decode-0",
    ]


def test_scaling_up_on_one_host_adds_and_moves_no_running_instance(record_of):
    changes = diff(record_of(2, 1), record_of(3, 2))
    # Prefills grow from GPU 0 up, decodes from GPU 4 down: prefill-2 takes GPU 2 and decode-1
    # GPU 3, and every running instance keeps its GPUs.
    assert kinds(changes) == [("add", "prefill-2"), ("add", "decode-1")]
    assert all(step.after == () for step in changes.steps)
    assert changes.unchanged == ("prefill-0", "prefill-1", "decode-0")
    assert changes.router == ()  # its worker list changes live: no restart
    assert changes.lines() == [
        "1. add prefill-2",
        "2. add decode-1",
        "unchanged: prefill-0, prefill-1, decode-0",
    ]


def test_scaling_down_removes_and_moves_nothing(record_of):
    changes = diff(record_of(3, 2), record_of(2, 1))
    assert kinds(changes) == [("remove", "prefill-2"), ("remove", "decode-1")]
    assert changes.steps[0].old_url.endswith(":30002")
    assert changes.unchanged == ("prefill-0", "prefill-1", "decode-0")


def test_a_gpu_changing_roles_waits_for_the_instance_that_holds_it(record_of):
    # 4 GPUs, 2P2D -> 3P1D: the new prefill-2 needs GPU 2, which decode-1 holds until it goes.
    changes = diff(record_of(2, 2, gpus=4), record_of(3, 1, gpus=4))
    assert kinds(changes) == [("remove", "decode-1"), ("add", "prefill-2")]
    assert changes.steps[1].after == ("decode-1",)
    assert changes.unchanged == ("prefill-0", "prefill-1", "decode-0")


def test_a_changed_flag_replaces_only_that_instance_and_says_which_flag(record_of):
    def fewer(data):
        data["decode"]["args"]["max-running-requests"] = 64

    changes = diff(record_of(), record_of(edit=fewer))
    (step,) = changes.steps
    assert (step.kind, step.instance) == ("replace", "decode-0")
    assert step.reasons == ("--max-running-requests 256 -> 64",)
    assert step.old_url == step.new_url
    # One decode: its replacement leaves the decodes without another instance
    # (kit.deploy.surge decides how that is covered).
    assert only_instances(changes, record_of()) == [step]


def test_env_changes_name_the_variable_not_its_value(record_of):
    def token(data):
        data["prefill"]["env"] = {"HF_TOKEN": "hf_secret"}

    changes = diff(record_of(), record_of(edit=token))
    assert kinds(changes) == [("replace", "prefill-0"), ("replace", "prefill-1")]
    assert changes.steps[0].reasons == ("env HF_TOKEN",)
    assert "hf_secret" not in "\n".join(changes.lines())


def test_new_templates_replace_every_process_one_by_one(record_of):
    changes = diff(record_of(), record_of(templates="t2"))
    assert [s.kind for s in changes.steps] == ["replace"] * 3
    assert changes.steps[0].reasons[0].startswith("its service files change")
    assert changes.router  # its files change too


def test_supervisords_own_template_replaces_no_process(tmp_path):
    # A process restarted does not apply supervisord.conf (its next start does): a change to it
    # alone must not replace every instance; one to the program template must.
    folder = tmp_path / "roles" / "pdkit_process" / "templates"
    folder.mkdir(parents=True)
    (folder / "program.conf.j2").write_text("[program:x]\n")
    (folder / "supervisord.conf.j2").write_text("[supervisord]\n")
    first = templates_digest(tmp_path)
    (folder / "supervisord.conf.j2").write_text("[supervisord]\nminfds=65536\n")
    assert templates_digest(tmp_path) == first
    (folder / "program.conf.j2").write_text("[program:x]\nstartsecs=5\n")
    assert templates_digest(tmp_path) != first


def test_restart_replaces_unchanged_instances_and_the_router_when_named(record_of):
    now = record_of()
    changes = diff(now, now, restart=["decode-0", "router"])
    assert kinds(changes) == [("replace", "decode-0")]
    assert changes.steps[0].reasons == ("restart",)
    assert changes.router == ("restart",)


def test_router_settings_restart_it_its_worker_list_does_not(record_of):
    def policy(data):
        data["router"]["decode_policy"] = "round_robin"

    assert diff(record_of(), record_of(edit=policy)).router == (
        "--decode-policy least_inflight -> round_robin",
    )
    assert diff(record_of(2, 1), record_of(2, 2)).router == ()


def test_under_nixl_a_replaced_prefill_has_every_decode_replaced_after_it(record_of):
    def nixl(record):
        return record.model_copy(update={"transfer_backend": "nixl"})

    def newer_prefill(data):
        data["prefill"]["args"] = {"max-running-requests": 8}

    changes = diff(nixl(record_of(2, 2)), nixl(record_of(2, 2, edit=newer_prefill)))
    assert kinds(changes) == [
        ("replace", "prefill-0"),
        ("replace", "prefill-1"),
        ("replace", "decode-0"),
        ("replace", "decode-1"),
    ]
    assert "reconnect to the replaced prefill-0, prefill-1" in changes.steps[2].reasons[0]
    assert changes.unchanged == ()


def test_waves_keep_one_instance_of_each_role_serving(record_of):
    changes = diff(record_of(3, 2), record_of(3, 2, templates="t2"))
    grouped = [[s.instance for s in wave] for wave in waves(changes, parallel=4)]
    assert grouped == [["prefill-0", "prefill-1"], ["prefill-2", "decode-0"], ["decode-1"]]
    assert [len(w) for w in waves(changes, parallel=1)] == [1] * 5


def _process(name, gpus, role="decode"):
    return ProcessRecord(
        name=name, instance=name, role=role, host="h", unit=name, gpus=gpus, fingerprint=name
    )


def test_two_instances_swapping_gpus_cannot_change_live():
    a_old, b_old = _process("decode-0", (0,)), _process("decode-1", (1,))
    a_new, b_new = _process("decode-0", (1,)), _process("decode-1", (0,))
    steps = [
        Step("replace", "decode-0", "decode", (a_old,), (a_new,)),
        Step("replace", "decode-1", "decode", (b_old,), (b_new,)),
    ]
    with pytest.raises(DeployError, match="cannot change decode-0, decode-1 live"):
        order(steps)


def test_a_multi_node_instance_is_one_step(tmp_path):
    data = yaml.safe_load((REPO / "topologies" / "deepseek-v3-2p2d.yaml").read_text())
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = resolve(path)
    before = build_record(plan, deploy_hosts(plan, PYTHON), TEMPLATES)
    data["decode"]["args"] = {**data["decode"].get("args", {}), "max-running-requests": 32}
    path.write_text(yaml.safe_dump(data))
    plan = resolve(path)
    after = build_record(plan, deploy_hosts(plan, PYTHON), TEMPLATES)
    changes = diff(before, after)
    multi = [s for s in changes.steps if len(s.new) > 1]
    assert multi, "the example has multi-node decodes"
    step = multi[0]
    assert [p.node_rank for p in step.new] == list(range(len(step.new)))
    assert step.describe().startswith(f"replace {step.instance} [{len(step.new)} nodes] (node 0: ")


def test_the_record_round_trips_privately_and_a_bad_one_says_how_to_start_over(record_of, tmp_path):
    record = record_of()
    save_record(tmp_path, record)
    assert load_record(tmp_path) == record
    path = tmp_path / "deployed.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_record(tmp_path / "nowhere") is None
    path.write_text('{"format": 1}')
    with pytest.raises(DeployError, match="To fix: delete it"):
        load_record(tmp_path)


def test_the_router_record_leaves_out_its_worker_list(record_of):
    small, big = record_of(2, 1), record_of(3, 2)
    router = DeploymentRecord.process(small, "router")
    assert router is not None and "--decode" not in [flag[0] for flag in router.flags]
    assert router.fingerprint == big.process("router").fingerprint


def _format_1(record):
    """`record` as pdkit wrote it before the flags were kept: each command as its argv."""
    data = json.loads(record.model_dump_json())
    data["format"] = 1
    for process in data["processes"]:
        process["args"] = [arg for flag in process.pop("flags") for arg in flag]
    return json.dumps(data)


def test_a_deployment_recorded_by_the_previous_release_still_changes(record_of, tmp_path):
    def policy_and_fewer(data):
        data["router"]["decode_policy"] = "round_robin"
        data["decode"]["args"]["max-running-requests"] = 64

    now = record_of()
    (tmp_path / "deployed.json").write_text(_format_1(now))
    old = load_record(tmp_path)
    assert old == now  # read into this format: the same flags, nothing to restart
    assert diff(old, now).nothing
    changes = diff(old, record_of(edit=policy_and_fewer))
    assert changes.router == ("--decode-policy least_inflight -> round_robin",)
    assert [s.reasons for s in changes.steps] == [("--max-running-requests 256 -> 64",)]
    save_record(tmp_path, old)
    assert json.loads((tmp_path / "deployed.json").read_text())["format"] == 2


def test_the_plan_says_how_the_router_restarts(record_of):
    pdkit = record_of()
    assert diff(pdkit, pdkit, restart=["router"]).lines()[0] == (
        "1. restart the router, handing its socket over (restart)"
    )

    def smg(data):
        data["router"] = {"kind": "smg", "port": 8000}

    plain = record_of(edit=smg)
    assert diff(plain, plain, restart=["router"]).lines()[0] == (
        "1. restart the router, draining it first (restart)"
    )
