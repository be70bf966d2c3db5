"""`pdkit up` / `pdkit down` end to end on the local default: real Ansible, real supervisord,
pdkit's sim workers and load balancer, requests from the openai client.

Each test deploys a copy of topologies/local.yaml under tmp_path with its own name, root and
free ports, so it never touches a developer's `make up`. Ansible is slow on a small machine:
the lifecycle test reuses one deployment for every step.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import yaml

from kit.deploy.services import supervisor_processes
from tests.support.local_deploy import API_KEY, chat, layout, pdkit, pids, processes_of


def test_up_serves_is_idempotent_restarts_only_what_changed_and_down_leaves_nothing(deployment):
    topology, name, data = deployment
    router_url = f"http://127.0.0.1:{data['router']['port']}"
    # local.yaml's hold (90 s): the only decode's replacement below relies on it (three GPUs,
    # none free for a stand-in; kit.deploy.surge expects twice its measured time away).
    assert data["router"]["faults"]["hold_timeout_s"] == 90

    first = pdkit("up", str(topology))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 of 2 pair(s) moved KV (2 prefill x 1 decode)" in first.stdout  # the gate
    assert f"Serving llama-3.1-8b at {router_url}" in first.stdout
    assert "curl -s" in first.stdout
    assert chat(router_url, stream=False)
    assert chat(router_url, stream=True)
    before = pids(topology, name)
    assert set(before) == {"prefill-0", "prefill-1", "decode-0", "router"}

    # pdkit doctor: the 2 x 1 matrix, every pair with its TTFT and KV transfer figures.
    doctor = pdkit("doctor", str(topology), "--json", timeout=60)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    matrix = json.loads(doctor.stdout)
    assert [(p["prefill"], p["decode"], p["state"]) for p in matrix["pairs"]] == [
        ("prefill-0", "decode-0", "ok"),
        ("prefill-1", "decode-0", "ok"),
    ]
    assert all(p["ttft_ms"] > 0 and p["kv_transfer_ms"] > 0 for p in matrix["pairs"])
    assert matrix["kv_cost"]["bytes_per_token"] == 131072
    # A hung decode: doctor fails within its timeout, naming both pairs with decode-0.
    os.kill(before["decode-0"], signal.SIGSTOP)
    try:
        hung = pdkit("doctor", str(topology), "--timeout", "5", timeout=30)
    finally:
        os.kill(before["decode-0"], signal.SIGCONT)
    assert hung.returncode == 1, hung.stdout + hung.stderr
    assert "prefill-0 x decode-0: failed: decode-0 does not answer /health" in hung.stdout
    assert "prefill-1 x decode-0: failed: decode-0 does not answer /health" in hung.stdout
    assert "0 of 2 pair(s) moved KV" in hung.stdout

    again = pdkit("up", str(topology))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "changed (" not in again.stdout
    assert pids(topology, name) == before

    data["decode"]["args"]["max-running-requests"] = 64
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    changed = pdkit("up", str(topology))
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "changed (decode-0)" in changed.stdout
    assert "decode-0 is the only decode and no GPU is free for a stand-in" in changed.stdout
    assert "hold: it is expected back within the router's hold (90 s" in changed.stdout
    after = pids(topology, name)
    assert after["decode-0"] != before["decode-0"]
    assert {k: v for k, v in after.items() if k != "decode-0"} == {
        k: v for k, v in before.items() if k != "decode-0"
    }
    assert chat(router_url, stream=False)

    # pdkit bench takes the router, model and key from the topology and predicts from its Plan.
    bench = pdkit("bench", str(topology), "--rate", "8", "--requests", "12", "--json")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    report = json.loads(bench.stdout)
    assert report["target"] == {"url": router_url, "model": "llama-3.1-8b"}
    (point,) = report["points"]
    assert point["requests"] + 1 == 12 and point["ok"] == point["requests"]  # 1 warm-up
    assert set(point["decode"]) == {f"http://127.0.0.1:{data['decode']['port']}"}
    assert report["prediction"]["goodput"] > 8 and report["gpus"] == 3
    # ...and records what it measured, for pdkit size --calibrate to check.
    roles = report["deployment"]["roles"]
    assert (roles["prefill"]["instances"], roles["decode"]["instances"]) == (2, 1)
    assert report["deployment"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"

    # The API key lives only in the router's environment file (0600), nowhere else.
    env_file = Path(layout(topology, name).env_file("router"))
    assert API_KEY in env_file.read_text()
    assert env_file.stat().st_mode & 0o777 == 0o600
    for output in (first, again, changed):
        assert API_KEY not in output.stdout + output.stderr
    for path in (topology.parent / ".pdkit" / name / "ansible").rglob("*"):
        if path.is_file():
            assert API_KEY not in path.read_text(errors="replace"), path

    down = pdkit("down", str(topology))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Stopped deployment" in down.stdout
    deadline = time.monotonic() + 10
    while processes_of(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(name) == []
    assert supervisor_processes(layout(topology, name).supervisord_socket) is None
    assert Path(layout(topology, name).log_file("decode-0")).stat().st_size > 0  # logs kept

    quiet = pdkit("down", str(topology))
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert f"Nothing of deployment {name} was running." in quiet.stdout
    assert "changed" not in quiet.stdout


def test_a_decode_that_cannot_start_fails_up_with_its_log_tail(deployment):
    topology, _, data = deployment
    timeout = 60
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", data["decode"]["port"]))
        squatter.listen()
        started = time.monotonic()
        result = pdkit("up", str(topology), "--timeout", str(timeout))
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < timeout + 60  # Ansible's own time on top of the readiness timeout
    assert "decode-0 on localhost" in result.stderr
    assert "lines of" in result.stderr and "decode-0.log" in result.stderr
    assert "| " in result.stderr  # the log tail itself
    assert "Still running: " in result.stderr and "prefill-0" in result.stderr
    assert "The router was not started" in result.stderr

    logs = pdkit("logs", str(topology), "decode", "-n", "5", timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert 0 < len(logs.stdout.splitlines()) <= 5
    every = pdkit("logs", str(topology), "-n", "1", timeout=60)
    assert "prefill-0 | " in every.stdout
    assert "no log yet" in every.stderr  # the router never started
