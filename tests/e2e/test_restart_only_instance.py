"""`pdkit restart ... decode` of a deployment's only decode (local.yaml, sim workers): with a
free GPU a stand-in serves while it restarts and no request fails under load; without one the
router holds the decodes' requests while it is away and none fails either; with a hold shorter
than its time away, the restart is refused, naming the gap, and `--force` proceeds."""

from __future__ import annotations

import json
import socket
import time

import yaml

from tests.support.local_deploy import (
    assert_load_covered,
    bench_under_load,
    end_bench,
    pdkit,
    pids,
)


def _deploy(deployment_, gpus: int, hold: float | None = None):
    topology, name, data = deployment_
    data["hosts"][0]["gpus"] = gpus
    if hold is not None:
        data["router"]["faults"] = {"hold_timeout_s": hold}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    first = pdkit("up", str(topology))
    assert first.returncode == 0, first.stdout + first.stderr
    return topology, name


def _restart_under_load(topology, out):
    """`pdkit restart TOPOLOGY decode` 3 s into `pdkit bench`'s load: (the restart's result, the
    bench's per-request records, seconds from the load's start to the restart's end)."""
    bench = bench_under_load(topology, out)
    started = time.monotonic()
    try:
        time.sleep(3.0)  # the load runs before the restart begins
        restart = pdkit("restart", str(topology), "decode")
        ops_s, ended = time.monotonic() - started, time.time()
        output = end_bench(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert restart.returncode == 0, restart.stdout + restart.stderr
    assert bench.returncode == 0, output
    assert_load_covered(out, ended)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return restart, records, ops_s


def test_restarting_the_only_decode_with_a_free_gpu_surges_and_fails_no_request(
    deployment,
    tmp_path,
):
    # 4 GPUs, 2P1D: prefills on GPUs 0 and 1, decode-0 on 3, GPU 2 free for the stand-in.
    topology, name = _deploy(deployment, gpus=4)
    before = pids(topology, name)
    restart, records, _ = _restart_under_load(topology, tmp_path / "bench")
    out = restart.stdout
    assert "decode-0 is the only decode: surge: decode-1 starts first on localhost GPU 2" in out
    assert "Surge: decode-1 stands in while decode-0 is replaced" in out
    assert "decode-1: in the router" in out and "out of the router, drained" in out

    after = pids(topology, name)
    assert set(after) == {"prefill-0", "prefill-1", "decode-0", "router"}  # the stand-in left
    assert after["decode-0"] != before["decode-0"]
    for kept in ("prefill-0", "prefill-1", "router"):
        assert after[kept] == before[kept]
    # What runs is what the topology places: a later `pdkit up` has nothing to change.
    diff = pdkit("up", str(topology), "--diff", timeout=60)
    assert "no change: every process runs with the topology's settings" in diff.stdout
    failed = [r for r in records if not r["ok"]]
    assert not failed, failed[:5]
    # The stand-in served while decode-0 was out.
    stand_in = f"http://127.0.0.1:{deployment[2]['decode']['port'] + 1}"
    assert any(r["decode"] == stand_in for r in records), {r["decode"] for r in records}


def test_without_a_free_gpu_a_start_longer_than_the_hold_is_refused_unless_forced(
    deployment,
):
    # 3 GPUs, 2P1D: none free; a hold of 0.5 s is shorter than any sim start with its playbook.
    topology, name = _deploy(deployment, gpus=3, hold=0.5)
    before = pids(topology, name)
    refused = pdkit("restart", str(topology), "decode")
    assert refused.returncode != 0
    text = " ".join((refused.stdout + refused.stderr).split())
    assert "decode-0 would leave the decodes without an instance for about" in text
    assert "start measured on these hosts, the rest pdkit's figures for engine sim" in text
    assert "the router holds requests only 0.5 s" in text and "--force" in text
    assert pids(topology, name) == before  # nothing was changed

    forced = pdkit("restart", str(topology), "decode", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "forced: decode-0 would leave the decodes without an instance" in forced.stdout
    after = pids(topology, name)
    assert after["decode-0"] != before["decode-0"] and after["router"] == before["router"]


def test_a_stand_in_that_cannot_start_is_taken_away_and_the_decode_left_serving(
    deployment,
):
    topology, name = _deploy(deployment, gpus=4)
    before = pids(topology, name)
    _, _, data = deployment
    # Something else listens on the stand-in's port (decode port + 1): it cannot start.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", data["decode"]["port"] + 1))
        squatter.listen()
        failed = pdkit("restart", str(topology), "decode", "--timeout", "20")
    assert failed.returncode != 0
    text = failed.stdout + failed.stderr
    assert "The stand-in decode-1 was stopped and its service definitions deleted" in text
    assert pids(topology, name) == before  # decode-0 untouched, no decode-1 left


def test_restarting_the_only_decode_without_a_free_gpu_holds_and_fails_no_request(
    deployment,
    tmp_path,
):
    # local.yaml as it is: 3 GPUs, 2P1D, none free. The router lists decode-0 as returning
    # while it is replaced (stop, start, gate, readmission), so the decodes' requests are held
    # within the hold, not refused. The hold is local.yaml's 90 s: make test runs
    # modules side by side on 2 cores, where the window measured 35 s against 19-20 s alone.
    topology, name = _deploy(deployment, gpus=3, hold=90)
    before = pids(topology, name)
    restart, records, ops_s = _restart_under_load(topology, tmp_path / "bench")
    out = restart.stdout
    print(out)
    assert "hold: it is expected back within the router's hold (90 s" in out
    assert "the router holds their role's requests until they are back" in out
    assert "away " in out and "readmission" in out
    after = pids(topology, name)
    assert after["decode-0"] != before["decode-0"] and after["router"] == before["router"]
    failed = [r for r in records if not r["ok"]]
    print(f"restart took {ops_s - 3.0:.1f} s; {len(records)} requests, {len(failed)} failed")
    assert not failed, (len(failed), len(records), failed[:3])
