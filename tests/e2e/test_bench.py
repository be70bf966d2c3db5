"""`pdkit bench` against real emulated PD workers behind pdkit's router: records, summary and
figures; a decode that hangs mid-run; runs side by side with `compare`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kit.observe.prom import parse_metrics
from tests.conftest import REPO, run_pdkit
from tests.support.lb_cluster import FAST_HEALTH
from tests.support.sim_launch import PdCluster, request_json

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "4", "PDKIT_SIM_GPU": "H100-SXM"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cluster() -> Iterator[PdCluster]:
    """One prefill and one decode sim worker behind `python -m kit.lb`."""
    with PdCluster(model=MODEL, env=SIM_ENV, lb_args=FAST_HEALTH) as running:
        yield running


def wait_for_a_request(worker: str, timeout_s: float = 60) -> None:
    """Until the sim worker at `worker` has a request running or done."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, text = request_json(worker + "/metrics")
        metrics = parse_metrics(str(text))
        names = ("sglang:num_running_reqs", "sglang:num_requests_total")
        if any(s.value > 0 for name in names for s in metrics.samples(name)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no request reached {worker} in {timeout_s} s")


def bench(cluster: PdCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_pdkit("bench", "--url", cluster.url, "--model", MODEL, *args, timeout=timeout)


def test_two_rates_leave_every_record_a_summary_and_the_figures(cluster, tmp_path):
    out = tmp_path / "run"
    result = bench(
        cluster, "--rates", "8,16", "--requests", "12", "--warmup", "2", "--out", str(out)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 24
    assert [r["rate"] for r in records] == [8.0] * 12 + [16.0] * 12
    assert all(r["ok"] and r["status"] == 200 for r in records)
    assert all(r["completion_tokens"] == r["output_tokens"] == 64 for r in records)
    assert all(r["prompt_tokens"] == r["input_tokens"] == 512 for r in records)
    # One gap per stream event after the first; a loaded worker, like SGLang, sends the tokens
    # made since its last write in one event, so a stream has at most 63 gaps, never none.
    assert all(1 <= len(r["itl_ms"]) <= 63 and r["ttft_ms"] > 0 for r in records)
    # pdkit's router says where each request went.
    assert {r["prefill"] for r in records} == {cluster.prefill.url}
    assert {r["decode"] for r in records} == {cluster.decode.url}
    assert all(isinstance(r["bootstrap_room"], int) for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert [p["rate"] for p in summary["points"]] == [8.0, 16.0]
    assert all(p["requests"] == 10 and p["ok"] == 10 for p in summary["points"])  # 2 warm-up
    assert 0 <= summary["points"][0]["attainment"] <= 1
    assert summary["points"][0]["decode"] == {cluster.decode.url: {"requests": 10, "failed": 0}}
    for name in ("attainment", "ttft_cdf", "tpot_cdf", "latency_throughput", "timeline"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG, name
    assert "16 req/s" in result.stdout and "attain" in result.stdout

    again = tmp_path / "again"
    second = bench(cluster, "--rate", "8", "--requests", "6", "--out", str(again), "--label", "b")
    assert second.returncode == 0, second.stdout + second.stderr
    compared = run_pdkit("bench", "compare", str(out), str(again), "--out", str(tmp_path / "cmp"))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "run" in compared.stdout and "b" in compared.stdout
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == PNG


def test_a_hung_decode_ends_the_run_in_its_timeout_and_is_named(cluster, tmp_path):
    out = tmp_path / "hung"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from kit.cli import main; main()",
            "bench",
            "--url",
            cluster.url,
            "--model",
            MODEL,
            "--rate",
            "6",
            "--requests",
            "18",
            "--warmup",
            "0",
            "--timeout",
            "4",
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_a_request(cluster.decode.url)  # the run is under way
    cluster.decode.kill(signal.SIGSTOP)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        cluster.decode.kill(signal.SIGCONT)
    assert proc.returncode == 0, stdout + stderr
    summary = json.loads((out / "summary.json").read_text())["points"][0]
    # From the first send to the last answer: the schedule, one timeout, and slack for a loaded
    # machine's late sends (the bench's own start-up is not in it).
    assert summary["wall_s"] < 18 / 6 + 4 + 10
    assert summary["errors"].get("timeout", 0) >= 5
    assert summary["requests"] == 18
    # Every failure is on the stopped decode: timeouts, and a stream already under way that the
    # router ended at its --stall-timeout (a chat stream cannot be continued exactly elsewhere).
    assert set(summary["errors"]) <= {"timeout", "stream"}
    assert summary["decode"][cluster.decode.url]["failed"] == sum(summary["errors"].values())
    assert f"requests through decode {cluster.decode.url} failed" in stdout
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    hung = [r for r in records if r["error_kind"] == "timeout"]
    # Every hung request is put on the stopped decode: from the answer's headers where its
    # stream had begun before the stop, else by asking the router where it went.
    assert all(r["decode"] == cluster.decode.url for r in hung)
    assert any(r["status"] == 0 for r in hung)  # at least one got no answer at all


def test_ctrl_c_stops_sending_lets_the_requests_in_flight_finish_and_writes_the_results(
    cluster, tmp_path
):
    out = tmp_path / "stopped"
    argv = ["bench", "--url", cluster.url, "--model", MODEL, "--rates", "4,8"]
    argv += ["--requests", "400", "--warmup", "0", "--json", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from kit.cli import main; main()", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_a_request(cluster.decode.url)  # the first point is under way (100 s of sends)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout + stderr
    assert "stopping: no new requests" in stderr
    summary = json.loads(stdout)
    assert summary["stopped_early"] is True
    (point,) = summary["points"]  # the second rate never began
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert 0 < len(records) == point["requests"] < 400
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]][:3]
