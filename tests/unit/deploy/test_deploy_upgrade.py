"""`pdkit upgrade`'s plan, progress and refusals (kit.deploy.upgrade), on local.yaml's records:
what an upgrade may change, the steps --dry-run lists with each role's time below its count,
the progress an interrupted upgrade leaves and what --resume and --rollback accept. Nothing
here starts a process (the e2e in tests/e2e/test_upgrade.py does)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console

from kit.deploy.changes import diff
from kit.deploy.state import build_record, save_record, templates_digest
from kit.deploy.steps import UpOptions
from kit.deploy.surge import StartEstimate
from kit.deploy.upgrade import (
    UpgradeProgress,
    below_count,
    file_digest,
    forget_progress,
    load_progress,
    progress_path,
    save_progress,
    step_plans,
    target_context,
    upgrade,
    upgrade_steps,
)
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.playbook import playbooks_dir
from kit.observe.doctor_tokens import Answer
from kit.plan.resolve import resolve
from tests.conftest import REPO


@pytest.fixture
def local(tmp_path):
    """A function: (file name, edit) -> the context of local.yaml so edited, in tmp_path."""
    base = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())

    def build(name="local.yaml", edit=None, folder=tmp_path):
        data = yaml.safe_load(yaml.safe_dump(base))
        if edit:
            edit(data)
        path = folder / name
        path.write_text(yaml.safe_dump(data))
        return DeployContext.build(resolve(path), path)

    return build


def _running(ctx: DeployContext) -> None:
    """Record `ctx`'s deployment as running (what `pdkit up` leaves)."""
    digest = templates_digest(playbooks_dir(ctx.private_dir))
    save_record(ctx.state_dir, build_record(ctx.plan, ctx.hosts, digest))


def _record(ctx):
    return build_record(ctx.plan, ctx.hosts, templates_digest(playbooks_dir(ctx.private_dir)))


def _revision(data):
    data["model"]["revision"] = "v2"


def _upgrade(ctx, target, **kwargs):
    console = Console(record=True, width=200)
    upgrade(ctx, target, console, UpOptions(), **kwargs)
    return " ".join(console.export_text().split())


def test_a_new_revision_replaces_every_instance_and_nothing_else(local):
    source, target = local(), local("new.yaml", _revision)
    steps = upgrade_steps(diff(_record(source), _record(target)), "new.yaml", set())
    assert [(s.kind, s.instance) for s in steps] == [
        ("replace", "prefill-0"),
        ("replace", "prefill-1"),
        ("replace", "decode-0"),
    ]
    assert all(s.reasons == ("--revision v2 added",) for s in steps)


def test_scaling_in_the_target_is_refused_naming_the_counts(local):
    source = local()
    target = local(
        "new.yaml", lambda d: (d["decode"].update(count=2), d["hosts"][0].update(gpus=4))
    )
    with pytest.raises(DeployError) as raised:
        upgrade_steps(diff(_record(source), _record(target)), "new.yaml", {"decode-0"})
    text = str(raised.value)
    assert "--to new.yaml changes more than an upgrade does: add decode-1" in text
    assert "keep prefill.count, decode.count and the hosts as they run" in text


def test_time_below_count_is_the_estimates_of_all_but_surged_steps(local):
    source, target = local(), local("new.yaml", _revision)
    changes = diff(_record(source), _record(target))
    estimates = {s.instance: StartEstimate(10.0, "measured") for s in changes.steps}
    plans = step_plans(changes.steps, changes.serving, estimates, {})
    assert below_count(plans) == {"prefill": 20.0, "decode": 10.0}
    assert plans[0].line(1) == (
        "1. replace prefill-0 (--revision v2 added): the prefills at 1 of 2 for about 10 s "
        "(1 other prefill(s) serve; measured)"
    )


def test_dry_run_lists_each_step_how_its_role_is_covered_and_the_time_below_count(local):
    # local.yaml: 3 GPUs, none free: the only decode is held by the router; 4 GPUs: surged.
    source = local()
    _running(source)
    target = local("new.yaml", _revision)
    text = _upgrade(source, target.topology_file, dry_run=True)
    assert "1. replace prefill-0 (--revision v2 added): the prefills at 1 of 2 for about" in text
    assert "3. replace decode-0 (--revision v2 added): the decodes at 0 of 1 for about" in text
    assert "the router holds the decodes' requests meanwhile" in text
    assert "Below its count (the sum of the steps' estimates): prefill (2 instances): about" in text
    assert "Nothing was changed (--dry-run)." in text
    assert not progress_path(source.state_dir).exists()

    def four_gpus(data):
        data["hosts"][0]["gpus"] = 4

    source = local(edit=four_gpus)
    _running(source)
    target = local("new.yaml", lambda d: (_revision(d), four_gpus(d)))
    text = _upgrade(source, target.topology_file, dry_run=True)
    assert "surge: decode-1 starts first on localhost GPU 2" in text
    assert "the decodes stay at 1" in text
    assert "decode (1 instance): about 0 s" in text


def test_an_upgrade_needs_a_running_deployment_and_a_target(local):
    source = local()
    with pytest.raises(DeployError, match=r"nothing to upgrade\. To fix: `pdkit up "):
        _upgrade(source, None)
    _running(source)
    with pytest.raises(DeployError) as raised:
        _upgrade(source, None)
    text = str(raised.value)
    assert "needs the topology to move to" in text
    assert "sglang_version and hosts[].sglang_python" in text and "model.revision" in text
    assert "--to NEW.yaml" in text


def test_the_running_topology_must_be_what_runs(local):
    source = local()
    _running(local(edit=lambda d: d["decode"]["args"].update({"max-running-requests": 64})))
    target = local("new.yaml", _revision)
    with pytest.raises(DeployError) as raised:
        _upgrade(source, target.topology_file)
    text = str(raised.value)
    assert "is not what runs (replace decode-0 (--max-running-requests 64 -> 256))" in text
    assert "an upgrade rolls back to it" in text and "`pdkit up " in text


def test_a_target_of_another_deployment_or_another_root_is_refused(local, tmp_path):
    source = local()
    other = local("other.yaml", lambda d: d.update(name="other"))
    with pytest.raises(DeployError, match="is deployment other, the running one is local"):
        target_context(source, other.topology_file)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = local("new.yaml", _revision, folder=elsewhere)
    with pytest.raises(DeployError, match=r"another root .* put --to's file beside"):
        target_context(source, moved.topology_file)


def _progress(source, target, **kwargs):
    return UpgradeProgress(
        source=str(source.topology_file.absolute()),
        target=str(target.topology_file.absolute()),
        target_digest=file_digest(target.topology_file),
        expected_ids=(1, 2, 3),
        expected_text="abc",
        **kwargs,
    )


def test_progress_round_trips_and_a_damaged_file_says_how_to_start_over(local):
    source, target = local(), local("new.yaml", _revision)
    assert load_progress(source.state_dir) is None
    progress = _progress(source, target)
    save_progress(source.state_dir, progress)
    assert load_progress(source.state_dir) == progress
    assert progress.expected == Answer((1, 2, 3), "abc")
    progress_path(source.state_dir).write_text("{not json")
    with pytest.raises(
        DeployError, match=r"progress .* is not one this pdkit can read .* To fix: delete it"
    ):
        load_progress(source.state_dir)
    forget_progress(source.state_dir)
    assert load_progress(source.state_dir) is None


def test_an_interrupted_upgrade_is_resumed_or_rolled_back_not_started_again(local):
    source, target = local(), local("new.yaml", _revision)
    _running(source)
    with pytest.raises(DeployError, match=r"no upgrade of deployment local is under way"):
        _upgrade(source, None, mode="resume")
    save_progress(source.state_dir, _progress(source, target))
    with pytest.raises(DeployError) as raised:
        _upgrade(source, target.topology_file)
    text = str(raised.value)
    assert "was interrupted" in text
    assert "--resume` goes on with it" in text and "--rollback` goes back" in text
    # --resume finds the target in the progress; --dry-run shows what is left.
    text = _upgrade(source, None, mode="resume", dry_run=True)
    assert "(resumed)" in text and "3. replace decode-0" in text
    other = local("other.yaml", _revision)
    with pytest.raises(DeployError, match="is not the upgrade under way"):
        _upgrade(source, other.topology_file, mode="resume")
    # Interrupted while decode-0 was away (stopped, its replacement not yet in): it is added.
    record = _record(source)
    save_record(
        source.state_dir,
        record.without(p.name for p in record.processes if p.instance == "decode-0"),
    )
    text = _upgrade(source, None, mode="resume", dry_run=True)
    assert "1. add decode-0: the decodes at 0 of 1" in text
    # A target changed since the start would move the rest elsewhere.
    Path(target.topology_file).write_text(Path(target.topology_file).read_text() + "\n# edited\n")
    with pytest.raises(DeployError, match=r"changed \(or is gone\) since the upgrade started"):
        _upgrade(source, None, mode="resume")


def test_a_rollback_in_the_middle_is_finished_by_rollback_not_resume(local):
    source, target = local(), local("new.yaml", _revision)
    _running(source)
    stopped = _progress(source, target, status="rolling back", reason="the gate failed\nmore")
    save_progress(source.state_dir, stopped)
    with pytest.raises(DeployError, match=r"stopped \(the gate failed\) and was rolling back"):
        _upgrade(source, None, mode="resume")
    text = _upgrade(source, None, mode="rollback", dry_run=True)
    assert "Rollback: back to" in text and "no change: every process runs" in text
