"""`pdkit autoscale` on a live sim deployment (1 prefill, 3 decodes started with
enable-pd-role-switch) under long prompts and short answers: a --dry-run decision that says
why and changes nothing, then an applied one that switches two decodes to prefill at once through
`POST /pd_role_switch` while `pdkit bench` sends requests, none of which fails; `pdkit status`
shows the decision."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid

import yaml

from kit.observe.prom import parse_metrics
from tests.support.local_deploy import end_bench, pdkit, shut_down, start_bench, write_topology


def bench(topology, out, seconds: float) -> subprocess.Popen[str]:
    rate = 6
    return start_bench(topology, out, "--rate", str(rate), "--duration", str(seconds),
                       "--requests", str(int(rate * seconds)), "--input-len", "2000",
                       "--output-len", "8")  # fmt: skip


def routed(port: int) -> float:
    """The requests pdkit's router has answered so far (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return parse_metrics(answer.read().decode()).total("pdkit_lb_requests_total") or 0


def until_routed(port: int, count: int, timeout: float = 60) -> None:
    """Wait until the load has begun: on a loaded machine the bench's start-up takes seconds,
    and an autoscale interval that saw none of it decides nothing."""
    deadline = time.monotonic() + timeout
    while routed(port) < count:
        assert time.monotonic() < deadline, f"the router answered fewer than {count} requests"
        time.sleep(0.2)


def test_a_dry_run_decides_and_an_applied_switch_fails_no_request(tmp_path):
    name = f"auto-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(tmp_path, name)
    data["hosts"][0]["gpus"] = 4
    data["prefill"]["count"], data["decode"]["count"] = 1, 3
    data["defaults"]["args"]["enable-pd-role-switch"] = True
    data["autoscale"] = {"interval_s": 3, "cooldown_s": 0, "min_requests": 5, "max_step": 2}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        up = pdkit("up", str(topology), "--no-gate")
        assert up.returncode == 0, up.stdout + up.stderr
        # A long load, ended once the switch is applied (end_bench): the two intervals and the
        # switch take seconds more on a loaded machine.
        load = bench(topology, tmp_path / "bench", 60)
        try:
            until_routed(data["router"]["port"], 3)
            dry = pdkit("autoscale", str(topology), "--dry-run", "--once", "--interval", "3")
            assert dry.returncode == 0, dry.stdout + dry.stderr
            assert "move 1P3D -> 3P1D" in dry.stdout, dry.stdout
            assert "move 2 instance(s) from decode to prefill); dry run: not applied" in dry.stdout
            for shown in ("observed: ", "corrections: compute", "(current)", "3P1D", "(chosen)"):
                assert shown in dry.stdout, dry.stdout
            # --once: the full interval (3 s), the arrivals counted by pdkit's router.
            shape = r"req/s, \d+ in / \d+ out tokens \(\d+ finished, \d+ arrived in 3 s\); TTFT"
            assert re.search(shape, dry.stdout), dry.stdout
            applied = pdkit("autoscale", str(topology), "--once", "--interval", "3")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            # One move's two instances switch together: both named in one change (the two
            # with the fewest requests in flight, so which two depends on the moment).
            moved = re.findall(r"(decode-\d) decode -> prefill \(drain", applied.stdout)
            assert len(moved) == 2 and "switched " in applied.stdout, applied.stdout
        finally:
            output = end_bench(load)
        assert load.returncode == 0, output
        point = json.loads((tmp_path / "bench" / "summary.json").read_text())["points"][0]
        assert point["ok"] == point["requests"] and point["errors"] == {}, point
        # A short run after the switch too: on a loaded machine the load may end before it.
        after = pdkit("bench", str(topology), "--rate", "6", "--requests", "24", "--input-len",
                      "2000", "--output-len", "8", "--no-predict", "--json", "--out",
                      str(tmp_path / "after"), timeout=120)  # fmt: skip
        assert after.returncode == 0, after.stdout + after.stderr
        records = [
            json.loads(line)
            for run in ("bench", "after")
            for line in (tmp_path / run / "requests.jsonl").open()
        ]
        assert all(r["ok"] for r in records), [r for r in records if not r["ok"]][:5]
        urls = {f"decode-{i}": f"http://127.0.0.1:{data['decode']['port'] + i}" for i in range(3)}
        for switched in moved:  # each served as a prefill
            assert any(r["prefill"] == urls[switched] for r in records), switched
        status = pdkit("status", str(topology), "--json", timeout=60)
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)["autoscale"]
        assert (shown["action"], shown["target"], shown["dry_run"]) == ("move", "3P1D", False)
        assert all(shown["roles"][s] == "prefill" for s in moved), shown["roles"]
    finally:
        shut_down(topology, name)
