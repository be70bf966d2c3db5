"""pdkit's router restarted under load by a handover (SIGUSR2: a new image on the same socket,
kit/lb/run.py): `pdkit restart ... router`, then a changed router setting through `pdkit up`,
while `pdkit bench` sends 4 requests/s; no request fails and the router keeps its PID."""

from __future__ import annotations

import json
import time

import yaml

from tests.support.local_deploy import end_bench, pdkit, pids, start_bench

RATE, SECONDS = 4.0, 40.0


def test_router_restart_and_setting_change_hand_over_and_fail_no_request(deployment, tmp_path):
    topology, name, data = deployment
    first = pdkit("up", str(topology))
    assert first.returncode == 0, first.stdout + first.stderr
    before = pids(topology, name)
    out = tmp_path / "bench"
    bench = start_bench(
        topology, out, "--rate", str(RATE), "--duration", str(SECONDS),
        "--requests", str(int(RATE * SECONDS)), "--output-len", "32",
    )  # fmt: skip
    try:
        time.sleep(3.0)  # the load runs before the router restarts
        restart = pdkit("restart", str(topology), "router")
        data["router"]["faults"]["retries"] = 1  # a router setting: pdkit up restarts it
        topology.write_text(yaml.safe_dump(data, sort_keys=False))
        changed = pdkit("up", str(topology))
        output = end_bench(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    print(restart.stdout, changed.stdout, sep="\n")
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert changed.returncode == 0, changed.stdout + changed.stderr
    for text in (restart.stdout, changed.stdout):
        assert "Router: handing over to a new process on its socket" in text
        assert "router: handed over in" in text
    assert "restart the router, handing its socket over (--retries 1 added)" in changed.stdout
    after = pids(topology, name)
    assert after == before  # every process, the router included, kept its PID
    assert bench.returncode == 0, output
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [r for r in records if not r["ok"]]
    print(f"{len(records)} requests, {len(failed)} failed")
    assert records and not failed, (len(failed), failed[:3])
