"""The gate checks tokens, not only that KV moved: a 2P2D sim deployment whose decode-1 receives
altered KV (PDKIT_SIM_FAULT=corrupt) without SGLang's KV checksum answers 200 with fluent, wrong
tokens and writes no line; `pdkit up`'s gate and `pdkit doctor` still fail, naming its pairs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from kit.deploy import gate
from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.observe.doctor import DoctorOptions
from kit.plan.resolve import resolve
from tests.support.ports import free_port, free_ports
from tests.support.sim_launch import SimProcess, worker_argv

FAST = {"PDKIT_SIM_SPEED": "10", "PDKIT_SIM_LOAD_SECONDS": "0.3"}
BAD = ("prefill-0 x decode-1", "prefill-1 x decode-1")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The workers of a 2P2D sim topology, started from the Plan's own argv and env (decode-1
    with the fault), each logging where the Plan says; plus a colocated sim of the same model."""
    folder = tmp_path_factory.mktemp("gate-tokens")
    prefill, bootstrap, decode = free_ports(3)
    data = {
        "name": "tokens",
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "llama"},
        "hosts": [
            {
                "name": "localhost",
                "address": "127.0.0.1",
                "connection": "local",
                "gpus": 4,
                "root": str(folder / "root"),
            }
        ],
        "prefill": {"count": 2, "port": prefill, "bootstrap_port": bootstrap},
        "decode": {"count": 2, "port": decode},
        "defaults": {"args": {"page-size": 16}},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"port": free_port(), "bind": "127.0.0.1"},
    }
    topology = folder / "tokens.yaml"
    topology.write_text(yaml.safe_dump(data))
    plan = resolve(topology)
    workers = []
    for w in plan.workers:
        fault = {"PDKIT_SIM_FAULT": "corrupt"} if w.name == "decode-1" else {}
        log = Path(w.log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        sim = SimProcess(
            w.command.args, env={**w.env, **FAST, **fault}, port=w.http_port, log_dir=log.parent
        )
        os.symlink(sim.log_path, log)
        workers.append(sim.start())
    reference = SimProcess(worker_argv(port=free_port()), env=FAST).start()
    try:
        for sim in (*workers, reference):
            sim.wait_ready()
        yield DeployContext.build(plan, topology), reference
    finally:
        for sim in (*workers, reference):
            sim.stop()


def test_the_gate_fails_on_silently_wrong_tokens_and_names_the_pairs(deployment):
    ctx, _ = deployment
    out = Console(record=True, width=200)
    with pytest.raises(DeployError) as raised:
        gate.transfer_gate(ctx, out, DoctorOptions(timeout_s=10))
    message = str(raised.value)
    assert "of 4 prefill x decode pair(s), 2 gave wrong tokens" in message
    assert f"({', '.join(BAD)})" in message
    for pair in BAD:
        assert f"{pair}: wrong: gave other tokens than the majority (2 of 4 pairs)" in message
    assert "every pair with decode-1 gives wrong tokens" in message
    assert "--disaggregation-enable-kv-checksum" in message
    assert "WRONG TOKENS" in out.export_text()
    # Nothing in the logs gave it away: SGLang checks no KV without the flag.
    log = Path(ctx.plan.process("decode-1").log_path).read_text()
    assert "checksum" not in log.lower() and "ERROR" not in log


def test_doctor_compares_every_pair_with_a_colocated_reference(deployment):
    ctx, reference = deployment
    out = Console(record=True, width=400)
    options = DoctorOptions(timeout_s=10, reference_url=reference.url)
    assert gate.run_doctor(ctx, out, options, as_json=True, input_tokens=2048) == 1
    report = json.loads(out.export_text())
    states = {f"{p['prefill']} x {p['decode']}": p["state"] for p in report["pairs"]}
    assert states == {
        "prefill-0 x decode-0": "ok",
        "prefill-1 x decode-0": "ok",
        **dict.fromkeys(BAD, "wrong"),
    }
    tokens = report["tokens"]
    assert tokens["reference"] == reference.url and tokens["agree"] == 2
    good = [p for p in report["pairs"] if p["state"] == "ok"]
    assert all(p["output_ids"] == tokens["expected_ids"] for p in good)
    assert len(tokens["expected_ids"]) == 8
    for p in report["pairs"]:
        if p["state"] == "wrong":
            assert "gave other tokens than the reference, from token 1" in p["symptom"]
            assert p["output_ids"][0] == tokens["expected_ids"][0]  # the prefill's own token
