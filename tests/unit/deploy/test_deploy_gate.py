"""`pdkit up`'s last gate: what it tells the user when a pair moves no KV, and how it reaches the
logs of remote hosts (the SSH options Ansible gets)."""

from __future__ import annotations

import pytest
from rich.console import Console

from kit.deploy import gate
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.inventory import DeployHost
from kit.hosts.logs import ssh_argv
from kit.observe.doctor import DoctorOptions, Instance, Matrix, PairResult, Transfer
from kit.observe.signatures import SIGNATURES, Match
from kit.plan.resolve import resolve
from kit.topology.layout import HostLayout
from kit.topology.plan_types import HostPlan
from tests.conftest import REPO

REFUSED = next(s for s in SIGNATURES if s.name == "rpc_refused")
LINE = (
    "E1130 20:37:11.860163 25683 transfer_metadata_plugin.cpp:1030] SocketHandShakePlugin: "
    "connect()10.0.0.2:1: Connection refused [111]"
)


def matrix(*pairs: PairResult) -> Matrix:
    def instance(name: str, role: str) -> Instance:
        return Instance(name, role, "http://x", "127.0.0.1", None, 1, (name,))  # type: ignore[arg-type]

    return Matrix(
        "local",
        (instance("prefill-0", "prefill"), instance("prefill-1", "prefill")),
        (instance("decode-0", "decode"),),
        pairs,
        0.4,
        15.0,
    )


@pytest.fixture
def ctx() -> DeployContext:
    return DeployContext.build(resolve(REPO / "topologies" / "local.yaml"), REPO / "local.yaml")


def test_a_failed_pair_fails_up_with_the_pair_the_cause_and_the_ways_out(ctx, monkeypatch):
    failed = PairResult(
        "prefill-0",
        "decode-0",
        "failed",
        symptom="decode-0 answered HTTP 500: Decode transfer failed",
        causes=(Match(REFUSED, LINE, "prefill-0"),),
    )
    ok = PairResult("prefill-1", "decode-0", "ok", ttft_ms=40.0, transfer=Transfer(3.0, 9.0, 1))
    monkeypatch.setattr(gate, "check", lambda plan, options, read: matrix(failed, ok))
    out = Console(record=True, width=120)
    with pytest.raises(DeployError) as raised:
        gate.transfer_gate(ctx, out, DoctorOptions())
    message = str(raised.value)
    assert "gate failed: of 2 prefill x decode pair(s), 1 did not move KV" in message
    assert "(prefill-0 x decode-0)" in message
    assert "cause (rpc_refused): the peer's Mooncake handshake (RPC) port refused" in message
    assert f"prefill-0: {LINE}" in message
    assert "pdkit up local.yaml --no-gate" in message.replace(str(REPO) + "/", "")
    assert "prefill-1" in out.export_text()  # the matrix was shown


def test_a_clean_matrix_passes_quietly(ctx, monkeypatch):
    ok = PairResult("prefill-0", "decode-0", "ok", ttft_ms=40.0, transfer=Transfer(3.0, 9.0, 1))
    other = PairResult("prefill-1", "decode-0", "ok", ttft_ms=41.0)
    monkeypatch.setattr(gate, "check", lambda plan, options, read: matrix(ok, other))
    out = Console(record=True, width=120)
    gate.transfer_gate(ctx, out, DoctorOptions())
    assert "2 of 2 pair(s) moved KV (2 prefill x 1 decode)" in out.export_text()


def test_pdkit_reaches_remote_logs_with_the_ssh_options_ansible_gets(monkeypatch):
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o UserKnownHostsFile=/bed/known_hosts")
    plan = HostPlan(
        name="b",
        address="10.0.0.2",
        connection="ssh",
        ssh_user="root",
        ssh_port=22,
        ssh_key=None,
        gpus=1,
        gpu_type=None,
        service_manager="supervisord",
        root="/",
        rdma_devices=(),
    )
    host = DeployHost(plan, HostLayout("d", "/"), "/usr/bin/python3")
    argv = ssh_argv(host, ["tail", "-n", "5", "/x.log"])
    assert argv[:3] == ["ssh", "-o", "UserKnownHostsFile=/bed/known_hosts"]
    assert argv[-2:] == ["root@10.0.0.2", "tail -n 5 /x.log"]
