"""Live operations on the local deployment under steady load: `pdkit up` from 2P1D to 3P2D,
`pdkit restart ... decode`, and `pdkit up` back to 2P1D while `pdkit bench` sends requests.
No request fails; the router and the instances the plan leaves alone keep their PIDs.

One host of 5 GPUs: prefills take GPUs from the bottom and decodes from the top, so scaling adds
and removes instances and touches no running one; `restart decode` replaces both decodes, one at
a time, while the other serves.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import yaml

from kit.deploy.services import supervisor_processes
from tests.support.local_deploy import (
    assert_load_covered,
    bench_under_load,
    end_bench,
    layout,
    pdkit,
    pids,
    shut_down,
    write_topology,
)


def _counts(topology: Path, data: dict, prefill: int, decode: int) -> None:
    data["prefill"]["count"], data["decode"]["count"] = prefill, decode
    topology.write_text(yaml.safe_dump(data, sort_keys=False))


def test_scale_up_restart_and_scale_down_under_load_fail_no_request(tmp_path):
    name = f"live-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(tmp_path, name)
    data["hosts"][0]["gpus"] = 5
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        first = pdkit("up", str(topology))
        assert first.returncode == 0, first.stdout + first.stderr
        before = pids(topology, name)

        _counts(topology, data, 3, 2)
        diff = pdkit("up", str(topology), "--diff", timeout=60)
        assert diff.returncode == 0, diff.stdout + diff.stderr
        assert (
            "1. add prefill-2\n  2. add decode-1\n  unchanged: prefill-0, prefill-1, decode-0"
            in (diff.stdout)
        )
        assert pids(topology, name) == before  # --diff changed nothing

        bench = bench_under_load(topology, tmp_path / "bench")
        started = time.monotonic()
        try:
            up = pdkit("up", str(topology))
            assert up.returncode == 0, up.stdout + up.stderr
            grown = pids(topology, name)
            restart = pdkit("restart", str(topology), "decode")
            assert restart.returncode == 0, restart.stdout + restart.stderr
            restarted = pids(topology, name)
            _counts(topology, data, 2, 1)
            down = pdkit("up", str(topology))
            assert down.returncode == 0, down.stdout + down.stderr
            ops_s, ended = time.monotonic() - started, time.time()
            output = end_bench(bench)
        finally:
            if bench.poll() is None:
                bench.kill()
        assert bench.returncode == 0, output

        # The router and the instances nobody touched kept running throughout.
        for after in (grown, restarted, pids(topology, name)):
            assert after["router"] == before["router"]
            assert after["prefill-0"] == before["prefill-0"]
            assert after["prefill-1"] == before["prefill-1"]
        assert grown["decode-0"] == before["decode-0"]  # scaling up moved no running instance
        assert set(grown) == {
            "prefill-0",
            "prefill-1",
            "prefill-2",
            "decode-0",
            "decode-1",
            "router",
        }
        assert restarted["decode-0"] != grown["decode-0"]
        assert restarted["decode-1"] != grown["decode-1"]
        assert restarted["prefill-2"] == grown["prefill-2"]
        final = pids(topology, name)
        assert set(final) == {"prefill-0", "prefill-1", "decode-0", "router"}
        assert final["decode-0"] == restarted["decode-0"]  # scaling down moved nothing either
        assert "out of the router, drained" in restart.stdout
        assert "Router: keeps running" in up.stdout + down.stdout

        records = [
            json.loads(line)
            for line in (tmp_path / "bench" / "requests.jsonl").read_text().splitlines()
        ]
        failed = [r for r in records if not r["ok"]]
        assert records and not failed, failed[:5]
        assert ops_s > 20
        assert_load_covered(tmp_path / "bench", ended)
    finally:
        if supervisor_processes(layout(topology, name).supervisord_socket) is not None:
            shut_down(topology, name)
