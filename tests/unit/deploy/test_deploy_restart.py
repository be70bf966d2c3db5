"""`pdkit restart` refuses, changing nothing, when nothing runs, the topology changed, or its
role's only instance would be out longer than the hold; `pdkit up --diff` says how the only
instance is covered."""

from __future__ import annotations

import io

import pytest
import yaml
from rich.console import Console

from kit.deploy import DeployContext, UpOptions, restart, up
from kit.deploy.state import build_record, save_record, templates_digest
from kit.errors import DeployError
from kit.hosts.playbook import playbooks_dir
from kit.plan.resolve import resolve
from tests.conftest import REPO


def context(tmp_path, edit=None) -> DeployContext:
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    if edit:
        edit(data)
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(data))
    return DeployContext.build(resolve(path), path, tmp_path / "state", "/venv/bin/python")


def record(ctx: DeployContext) -> None:
    digest = templates_digest(playbooks_dir(ctx.private_dir))
    save_record(ctx.state_dir, build_record(ctx.plan, ctx.hosts, digest))


def test_restart_needs_a_running_deployment(tmp_path):
    ctx = context(tmp_path)
    with pytest.raises(DeployError, match=r"nothing to restart\. To fix: `pdkit up "):
        restart(ctx, Console(file=io.StringIO()), UpOptions(), "decode")


def test_restart_refuses_a_changed_topology_and_says_what_differs(tmp_path):
    record(context(tmp_path))

    def more(data):
        data["decode"]["args"]["max-running-requests"] = 64

    ctx = context(tmp_path, edit=more)
    with pytest.raises(DeployError) as refused:
        restart(ctx, Console(file=io.StringIO()), UpOptions(), "prefill")
    message = str(refused.value)
    assert "replace decode-0 (--max-running-requests 256 -> 64)" in message
    assert "Nothing was changed" in message and "--diff" in message


def test_an_unknown_process_is_named_with_the_closest_one(tmp_path):
    ctx = context(tmp_path)
    record(ctx)
    with pytest.raises(DeployError, match="Did you mean 'decode-0'"):
        restart(ctx, Console(file=io.StringIO()), UpOptions(), "decode-9")


def test_restarting_the_only_decode_without_a_free_gpu_past_the_hold_changes_nothing(tmp_path):
    # local.yaml: 3 GPUs, 2P1D, none free; nothing measured, so the sim's figures (9 s away,
    # 18 s with the margin for load) against a 5 s hold.
    def short_hold(data):
        data["router"]["faults"] = {"hold_timeout_s": 5}

    ctx = context(tmp_path, edit=short_hold)
    record(ctx)
    with pytest.raises(DeployError) as refused:
        restart(ctx, Console(file=io.StringIO()), UpOptions(), "decode")
    message = str(refused.value)
    assert message.startswith(
        "decode-0 would leave the decodes without an instance for about 18 s (stop 3.0 s, "
        "start 5.0 s, gate 0.5 s, readmission 0.5 s: pdkit's figures for engine sim; none "
        "measured yet; 9.0 s x2 for load, which stretches a window)"
    )
    assert "localhost: 0 of 3" in message and "Nothing was changed" in message
    assert "`pdkit restart` again with --force" in message


def test_up_diff_says_a_changed_only_decode_gets_a_stand_in_on_the_free_gpu(tmp_path):
    def four(data):
        data["hosts"][0]["gpus"] = 4

    record(context(tmp_path, edit=four))

    def changed(data):
        four(data)
        data["decode"]["args"]["max-running-requests"] = 64

    out = io.StringIO()
    up(context(tmp_path, edit=changed), Console(file=out, width=300), UpOptions(diff_only=True))
    text = out.getvalue()
    assert "1. replace decode-0 (--max-running-requests 256 -> 64)" in text
    assert "decode-0 is the only decode: surge: decode-1 starts first on localhost GPU 2" in text
    assert "Nothing was changed (--diff)." in text


def _router_restart(tmp_path, kind, monkeypatch):
    """`pdkit restart ... router`'s router step on local.yaml with router `kind`: the playbook
    runs it makes, each as (playbook, tags, the router host's variables)."""
    from kit.deploy.changes import diff  # noqa: PLC0415
    from kit.deploy.live import LiveChange  # noqa: PLC0415

    def router_kind(data):
        data["router"]["kind"] = kind
        if kind == "smg":
            data["router"].pop("faults", None)

    ctx = context(tmp_path, edit=router_kind)
    digest = templates_digest(playbooks_dir(ctx.private_dir))
    target = build_record(ctx.plan, ctx.hosts, digest)
    live = LiveChange(ctx, Console(file=io.StringIO()), UpOptions(), {}, target, mode="restart")
    runs = []

    def run(self, playbook, tags, inventory):
        hosts = (inventory or {}).get("all", {}).get("children", {}).get("pdkit_hosts", {})
        runs.append((playbook, tags, hosts.get("hosts", {}).get("localhost", {})))

    monkeypatch.setattr(LiveChange, "_run", run)
    monkeypatch.setattr(LiveChange, "_router_started", lambda self: None)
    live._router(diff(target, target, restart=["router"]))
    return runs


def test_pdkits_router_is_handed_over_not_stopped(tmp_path, monkeypatch):
    (run,) = _router_restart(tmp_path, "pdkit", monkeypatch)
    playbook, tags, host_vars = run
    assert (playbook, tags) == ("deploy.yml", "router")
    assert host_vars["pdkit_process_hand_over"] == ["router"]


def test_smg_is_stopped_then_started(tmp_path, monkeypatch):
    runs = _router_restart(tmp_path, "smg", monkeypatch)
    assert [(p, t) for p, t, _ in runs] == [("stop.yml", None), ("deploy.yml", "router")]
