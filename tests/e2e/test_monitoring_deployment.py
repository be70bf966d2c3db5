"""Observability end to end on one local deployment (a copy of topologies/local.yaml with
`monitoring:` on, pdkit's router with admission): Prometheus from Debian's package scrapes every
target, every dashboard panel's query returns data after a short `pdkit bench`, `pdkit trace`
lays out a bench request and shows where a request to a hung decode stopped, an idle
deployment shows 0 running everywhere, and `pdkit down` stops Prometheus and keeps its data.

One deployment serves every step: `pdkit up` is most of the time this test takes.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from kit.deploy.services import supervisor_processes
from kit.observe.dashboard import dashboard, panel_queries, substitute
from kit.observe.probe import Prober
from kit.observe.prom import parse_metrics
from kit.observe.prometheus import query, scrape_health
from tests.support.local_deploy import API_KEY, layout, pdkit, processes_of
from tests.support.ports import free_ports
from tests.support.requires import require_command


@pytest.fixture(autouse=True)
def _prometheus_installed():
    require_command("prometheus", "prometheus")


SCRAPE_INTERVAL_S = 1


@pytest.fixture
def monitored(deployment):
    """The deployment fixture's copy of local.yaml with `monitoring:` on and admission in the
    router: (topology, name, data, layout, Prometheus URL), not yet up."""
    topology, name, data = deployment
    (port,) = free_ports(1)
    data["monitoring"] = {"port": port, "bind": "127.0.0.1", "scrape_interval_s": SCRAPE_INTERVAL_S}
    # Generous objectives: admission runs (its metrics exist) and refuses nothing.
    data["router"]["args"] = {"admission": True, "slo-ttft-ms": 5000, "slo-tpot-ms": 500}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    return topology, name, data, layout(topology, name), f"http://127.0.0.1:{port}"


def prometheus(coroutine_factory):
    async def run():
        async with Prober(timeout=5.0) as prober:
            return await coroutine_factory(prober)

    return asyncio.run(run())


def empty_panels(url: str, name: str) -> list[str]:
    """The panel queries that return no finite value."""
    empty = []

    async def ask(prober):
        for title, expr in panel_queries(dashboard()):
            result = await query(prober, url, substitute(expr, name, "1m"))
            values = [float(r["value"][1]) for r in result]
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{title}: {expr}")

    prometheus(ask)
    return empty


def router_traffic(router: str) -> dict[str, float]:
    """The requests the router itself has sent each worker so far (its URL: count): health
    probes (SGLang's /health runs a one-token generation) and canary rounds (one request to
    every pair each)."""
    with urllib.request.urlopen(router + "/metrics", timeout=10) as response:
        page = parse_metrics(response.read().decode())
    rounds = page.total("pdkit_lb_canary_rounds_total") or 0.0
    sent: dict[str, float] = {}
    for sample in page.samples("pdkit_lb_health_probes_total"):
        url = sample.labels["worker"]
        sent[url] = sent.get(url, rounds) + sample.value
    return sent


def _sent_during(before: dict[str, float], after: dict[str, float], url: str) -> float:
    return after.get(url, 0.0) - before.get(url, 0.0)


def idle_status(topology: Path, router: str, attempts: int = 5) -> dict:
    """`pdkit status --json` of the idle deployment. The router's own requests to the workers
    are real ones and run for a moment (a health probe every 5 s): a worker may say it runs
    one only if the router sent it one during that status call, and status is then asked
    again, as a user would; any other count fails at once."""
    for _ in range(attempts):
        before = router_traffic(router)
        status = pdkit("status", str(topology), "--json", timeout=60)
        report = json.loads(status.stdout)
        busy = [w for w in report["workers"] if w["running"]]
        if not busy:
            return report
        after = router_traffic(router)
        unexplained = [
            w["name"] for w in busy if _sent_during(before, after, f"http://{w['endpoint']}") == 0
        ]
        assert not unexplained, f"running on an idle deployment: {unexplained}"
    return report


def send_unanswered(router: str, request_id: str) -> None:
    """A completion whose answer we stop waiting for after 2 s."""
    body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 4}}).encode()
    request = urllib.request.Request(
        f"{router}/generate",
        body,
        {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {API_KEY}",
            "X-Request-Id": request_id,
        },
    )
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(request, timeout=2).read()


def test_prometheus_dashboard_trace_and_idle_status_on_one_deployment(monitored, tmp_path):
    topology, name, data, layout, prometheus_url = monitored
    router = f"http://127.0.0.1:{data['router']['port']}"

    up = pdkit("up", str(topology))
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"Prometheus: {prometheus_url} scrapes 5 targets every 1 s, 5 up." in up.stdout
    targets = prometheus(lambda p: scrape_health(p, prometheus_url))
    assert {(t.job, t.process, t.health) for t in targets} == {
        ("router", "router", "up"),
        ("prefill", "prefill-0", "up"),
        ("prefill", "prefill-1", "up"),
        ("decode", "decode-0", "up"),
        ("prometheus", "prometheus", "up"),
    }

    runs = tmp_path / "bench"
    bench = pdkit(
        "bench", str(topology), "--rate", "8", "--requests", "24", "--input-len", "256",
        "--output-len", "16", "--no-predict", "--out", str(runs),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    time.sleep(3 * SCRAPE_INTERVAL_S)  # the last counts scraped
    assert empty_panels(prometheus_url, name) == []

    # The slowest bench request: its prefill, decode and every phase.
    traced = pdkit("trace", str(topology), str(runs / "requests.jsonl"), timeout=60)
    assert traced.returncode == 0, traced.stdout + traced.stderr
    text = traced.stdout
    assert "status 200" in text and "-> decode decode-0" in text
    steps = (
        "received /v1/chat/completions",
        "bootstrap: found its prefill",
        "prefill: computed the prompt",
        "KV transfer: wrote the KV into the decode",
        "first token to the client",
        "decode: 15 more tokens",
        "answered 200",
    )
    for step in steps:
        assert step in text, step
    assert "phases: " in text and "KV transfer " in text and "stopped" not in text

    # Idle: nothing runs, and the probe does not count its own health check.
    report = idle_status(topology, router)
    assert [w["running"] for w in report["workers"]] == [0, 0, 0]

    # A decode that hangs: the request stops on its prefill, waiting for the decode.
    (decode_pid,) = [
        info.pid
        for process, info in supervisor_processes(layout.supervisord_socket).items()
        if process == "decode-0"
    ]
    request_id = f"hung-{uuid.uuid4().hex[:8]}"
    os.kill(decode_pid, signal.SIGSTOP)
    try:
        send_unanswered(router, request_id)
        hung = pdkit("trace", str(topology), request_id, timeout=60)
    finally:
        os.kill(decode_pid, signal.SIGCONT)
    assert hung.returncode == 0, hung.stdout + hung.stderr
    assert "stopped: decode-0 logged nothing for this request" in hung.stdout, hung.stdout
    assert "before prefill_bootstrap (bootstrap: waited for its decode" in hung.stdout, hung.stdout

    down = pdkit("down", str(topology))
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes_of(name) == []
    assert (Path(layout.prometheus_data_dir) / "wal").is_dir()  # its data stays
