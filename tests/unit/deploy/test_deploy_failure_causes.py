"""`pdkit up`'s failure report names the cause of a worker that failed at start-up from the
known line in its log (kit.observe.signatures), with the setting to change."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kit.deploy.readiness import Verdict
from kit.deploy.steps import raise_unless_ready
from kit.deploy.wait import ProcessStatus, worker_targets
from kit.errors import DeployError
from kit.hosts.context import load_context
from tests.conftest import REPO

# The lines torch writes (tests/unit/observe/test_observe_signatures.py has them with sources).
REAL_LINES = {
    "nccl_watchdog": "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
    "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds "
    "before timing out.",
    "dist_init_unreachable": "[E728 15:01:59.561275187 socket.cpp:1028] [c10d] The client socket "
    "has timed out after 600000ms while trying to connect to (10.0.0.1, 5000).",
}


@pytest.mark.parametrize(
    ("signature", "fix"),
    [
        ("nccl_watchdog", "raise cluster.distributed_timeout_s (--dist-timeout"),
        ("dist_init_unreachable", "open the dist-init port"),
    ],
)
def test_a_worker_that_failed_is_named_with_the_cause_its_log_shows(
    tmp_path: Path, signature: str, fix: str
):
    data = yaml.safe_load((REPO / "topologies/local.yaml").read_text())
    data["hosts"][0]["root"] = str(tmp_path / "root")
    topology = tmp_path / "local.yaml"
    topology.write_text(yaml.safe_dump(data))
    ctx = load_context(topology, control_python="/ctl/venv/bin/python")
    decode = ctx.plan.role("decode")[0]
    log = Path(decode.log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"loading the model\n{REAL_LINES[signature]}\nexiting\n")
    target = next(t for t in worker_targets(ctx.plan) if t.name == decode.name)
    failed = ProcessStatus(target, Verdict("failed", "exited with status 1"), 12.0)
    with pytest.raises(DeployError) as error:
        raise_unless_ready(ctx, [failed], stage="workers")
    text = str(error.value)
    assert f"cause ({signature}):" in text
    assert fix in text
