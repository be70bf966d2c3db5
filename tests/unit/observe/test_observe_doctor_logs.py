"""`pdkit doctor` reads every worker's log tail for known failure lines, also when every pair
passes now: a KV transfer that timed out under load is named with the setting to raise."""

from __future__ import annotations

import io
from pathlib import Path

import yaml
from rich.console import Console

from kit.errors import PdkitError
from kit.observe import doctor_view
from kit.observe.doctor import Matrix
from kit.observe.doctor_logs import finding_lines, log_findings
from kit.plan.resolve import resolve
from tests.conftest import REPO

# What the sim's `hang` fault and SGLang 0.5.23's decode write when the KV never came in time.
WAITING = (
    "[2026-05-12 10:07:11 TP0] Decode transfer failed for request rank=0 req.rid='9f2c' "
    "req.bootstrap_room=4121 with exception KVTransferError(bootstrap_room=4121): "
    "Request 4121 timed out after 300.0s in KVPoll.WaitingForInput"
)


def _plan(tmp_path: Path):
    data = yaml.safe_load((REPO / "topologies/local.yaml").read_text())
    data["hosts"][0]["root"] = str(tmp_path / "root")
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(data))
    return resolve(path)


def _logs(process: str) -> list[str]:
    if process == "prefill-1":
        raise PdkitError("cannot read it")
    return ["INFO decode batch", WAITING, WAITING] if process == "decode-0" else []


def test_timeouts_under_load_name_the_setting_to_raise_when_the_pairs_pass(tmp_path):
    plan = _plan(tmp_path)
    [finding] = log_findings(plan, _logs)
    assert (finding.process, finding.match.signature.name, finding.count) == (
        "decode-0",
        "transfer_timeout",
        2,
    )
    text = "\n".join(finding_lines([finding], pairs_ok=True))
    assert "decode-0: transfer_timeout (2 line(s))" in text
    assert (
        "raise transfer.timeouts.waiting_timeout_s (SGLANG_DISAGGREGATION_WAITING_TIMEOUT" in text
    )
    # When pairs fail too, the path is suspect first: the signature's own fix.
    assert "open TCP 15000-17000" in "\n".join(finding_lines([finding], pairs_ok=False))
    assert finding_lines([], pairs_ok=True) == []


def test_doctor_prints_the_log_findings_after_the_matrix(tmp_path, monkeypatch):
    plan = _plan(tmp_path)
    passing = Matrix(
        deployment=plan.name, prefills=(), decodes=(), pairs=(), seconds=0.1, timeout_s=5
    )
    monkeypatch.setattr(doctor_view, "check", lambda plan, options, read: passing)
    out = io.StringIO()
    code = doctor_view.doctor(
        plan, Console(file=out, width=200), doctor_view.DoctorOptions(), _logs
    )
    assert code == 0
    assert "logs: 1 known failure line(s) in the workers' recent logs:" in out.getvalue()
    assert "waiting_timeout_s" in out.getvalue()
