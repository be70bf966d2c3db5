"""Ansible's event stream -> progress lines, per-process changes and failure reports."""

from __future__ import annotations

from kit.hosts.events import RunProgress
from kit.hosts.playbook import PlaybookResult, failure_report

FILES_TASK = "Ensure the deployment's directories and each process's files are current"


def event(kind, host="localhost", task="t", **data):
    return {"event": kind, "event_data": {"host": host, "task": task, **data}}


def test_changed_processes_are_named_per_host():
    progress = RunProgress()
    progress.feed(event("runner_on_start", task=FILES_TASK))
    lines = progress.feed(
        event(
            "runner_on_ok",
            task=FILES_TASK,
            res={"changed": True, "changed_processes": ["decode-0"]},
        )
    )
    assert lines == [f"localhost: {FILES_TASK}: changed (decode-0)"]
    assert progress.changed
    assert progress.hosts["localhost"].changed == 1


def test_loop_items_are_reported_once_with_their_labels():
    progress = RunProgress()
    for label in ("prefill-0", "decode-0"):
        assert (
            progress.feed(
                event(
                    "runner_item_on_ok",
                    task="T",
                    res={"changed": True, "_ansible_item_label": label},
                )
            )
            == []
        )
    progress.feed(event("runner_item_on_ok", task="T", res={"changed": False, "item": "x"}))
    lines = progress.feed(event("runner_on_ok", task="T", res={"changed": True, "results": []}))
    assert lines == ["localhost: T: changed (prefill-0, decode-0)"]
    assert [c.item for c in progress.changes] == ["prefill-0", "decode-0"]


def test_unchanged_run_reports_nothing_but_the_counts():
    progress = RunProgress()
    assert progress.feed(event("runner_on_ok", res={"changed": False})) == []
    progress.feed(event("runner_on_skipped"))
    assert not progress.changed
    assert progress.summary() == "localhost: ok=1 changed=0"


def test_a_failure_names_host_task_and_stderr():
    progress = RunProgress()
    lines = progress.feed(
        event(
            "runner_on_failed",
            host="gpu-1",
            task="Ensure the supervisord of the deployment runs",
            res={
                "msg": "non-zero return code",
                "rc": 1,
                "stderr": "Traceback ...\nModuleNotFoundError: No module named supervisor",
            },
        )
    )
    assert lines == ["gpu-1: Ensure the supervisord of the deployment runs: FAILED"]
    report = progress.failures[0].describe()
    assert report.startswith(
        "host gpu-1: task 'Ensure the supervisord of the deployment runs' failed: "
        "non-zero return code"
    )
    assert "No module named supervisor" in report
    assert "pip install supervisor" in report


def test_ignored_errors_are_not_failures():
    progress = RunProgress()
    progress.feed(event("runner_on_failed", ignore_errors=True, res={"msg": "x"}))
    assert progress.failures == []


def test_item_failure_is_reported_once_with_its_item():
    progress = RunProgress()
    progress.feed(
        event(
            "runner_item_on_failed",
            task="T",
            res={"msg": "boom", "_ansible_item_label": "decode-0"},
        )
    )
    progress.feed(event("runner_on_failed", task="T", res={"msg": "One or more items failed"}))
    assert len(progress.failures) == 1
    assert progress.failures[0].describe().startswith("host localhost: task 'T' for decode-0")


def test_unreachable_host_says_how_to_check_ssh():
    progress = RunProgress()
    progress.feed(event("runner_on_unreachable", host="b", res={"msg": "ssh: connect refused"}))
    assert progress.hosts["b"].unreachable
    text = progress.failures[0].describe()
    assert "host b: unreachable" in text
    assert "ssh" in text
    assert progress.summary() == "b: unreachable"


def test_censored_results_stay_censored():
    progress = RunProgress()
    progress.feed(
        event("runner_on_failed", res={"censored": "the output has been hidden due to no_log"})
    )
    assert "hidden" in progress.failures[0].message


def test_failure_report_points_at_ansibles_output(tmp_path):
    (tmp_path / "stdout").write_text("ERROR! the role 'x' was not found\n")
    result = PlaybookResult("deploy.yml", "workers", "failed", 1, RunProgress(), tmp_path)
    report = failure_report(result)
    assert "Ansible failed in deploy.yml (workers stage)" in report
    assert "ERROR! the role 'x' was not found" in report
    assert str(tmp_path / "stdout") in report
