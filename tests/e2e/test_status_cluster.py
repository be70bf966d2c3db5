"""`pdkit health` and `pdkit status` against live sim workers and a live router.

Each cluster is a topology written into tmp (engine sim, host 127.0.0.1, free ports), resolved
to a Plan, and started process by process from the Plan's own argv and env, as `pdkit up`
would. Scenarios: all healthy (with traffic, rates and SLO shares), one worker down, one still
loading, one serving another model, a router with no healthy decode, KV transfer failures, and
the smg router.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from kit.plan.resolve import resolve
from kit.topology.plan_types import Plan, WorkerProcess
from tests.conftest import REPO, run_pdkit
from tests.support.ports import free_block
from tests.support.requires import require_smg

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SERVED = "llama-test"
FAST_SIM = {"PDKIT_SIM_LOAD_SECONDS": "0.2"}
ADMIN_KEY = "test-admin-key"
LONG_PROMPT = 60_000  # tokens: seconds of emulated prefill, time to kill the prefill mid-way
# The healthy cluster's prefills run at a quarter of the emulated GPU's speed: LONG_PROMPT then
# takes ~16 s to prefill (~4 s at full speed), so the tests that act while it is in flight
# (drain it, kill it while its decode waits for the KV) cannot miss that window on a loaded host.
SLOW_PREFILL = {"PDKIT_SIM_SPEED": "0.25"}
# Probe timeout (s) where every worker answers: generous, as a loaded 2-core machine can take
# seconds to answer /metrics, and a timed-out probe hides what the test looks for.
PROBE_TIMEOUT = 10


def write_topology(
    tmp: Path,
    name: str,
    *,
    prefill: int = 1,
    decode: int = 1,
    router: str = "pdkit",
    prefill_env: dict[str, str] | None = None,
    decode_env: dict[str, str] | None = None,
) -> Path:
    router_spec: dict[str, object] = {"kind": router, "port": free_block(1), "bind": "127.0.0.1"}
    if router == "pdkit":
        router_spec["args"] = {"health-interval": 0.2}
    else:
        router_spec["metrics_port"] = free_block(1)
        router_spec["args"] = {
            "health-check-interval-secs": 1,
            "health-failure-threshold": 1,
            "worker-startup-timeout-secs": 30,
        }
    data = {
        "name": name,
        "engine": "sim",
        "model": {"path": MODEL, "served_name": SERVED},
        "hosts": [
            {
                "name": "localhost",
                "address": "127.0.0.1",
                "connection": "local",
                "gpus": prefill + decode,
                "gpu_type": "H100-SXM",
                "service_manager": "supervisord",
            }
        ],
        "prefill": {
            "count": prefill,
            "port": free_block(prefill),
            "bootstrap_port": free_block(prefill),
            "env": prefill_env or {},
        },
        "decode": {"count": decode, "port": free_block(decode), "env": decode_env or {}},
        "transfer": {"backend": "mooncake_tcp"},
        "router": router_spec,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def http_status(
    url: str,
    body: dict | None = None,
    *,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 1.0,
) -> int | None:
    """The HTTP status of a GET (or, with `body`, a JSON POST); None when nothing answered."""
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Cluster:
    """The processes of one Plan; every one of them is stopped by `close`."""

    def __init__(self, topology: Path, logs: Path) -> None:
        self.topology = topology
        self.plan: Plan = resolve(topology)
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def worker(self, name: str) -> WorkerProcess:
        return next(w for w in self.plan.workers if w.name == name)

    def start_worker(
        self, name: str, edit: Callable[[list[str]], list[str]] | None = None, **env: str
    ) -> None:
        w = self.worker(name)
        argv = w.command.argv(sys.executable)
        self._spawn(name, edit(argv) if edit else argv, {**FAST_SIM, **w.env, **env})

    def start_router(self, **env: str) -> None:
        argv = self.plan.router.command.argv(sys.executable)
        if self.plan.router.kind == "smg":
            argv[0] = require_smg()
        self._spawn("router", argv, {**self.plan.router.env, **env})

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = (self.logs / f"{self.plan.name}-{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def wait_healthy(self, *names: str, timeout: float = 30.0) -> None:
        for name in names:
            url = self.worker(name).url + "/health"
            wait_until(
                f"{name} healthy ({self.log(name)})", lambda u=url: http_status(u) == 200, timeout
            )

    def wait_router_ready(self, ready: bool = True, timeout: float = 30.0) -> None:
        url = self.plan.router.url + "/readiness"
        want = 200 if ready else 503
        wait_until(
            f"router readiness {want} ({self.log('router')})",
            lambda: http_status(url) == want,
            timeout,
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=15)

    def log(self, name: str) -> str:
        path = self.logs / f"{self.plan.name}-{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()


@contextlib.contextmanager
def running(topology: Path, logs: Path) -> Iterator[Cluster]:
    cluster = Cluster(topology, logs)
    try:
        yield cluster
    finally:
        cluster.close()


pdkit = run_pdkit


def status_json(topology: Path, *extra: str) -> dict:
    result = pdkit("status", str(topology), "--json", "--timeout", "2", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stream_completions(router_url: str, count: int, max_tokens: int = 8) -> None:
    """Streamed chat completions through the router (the router times TTFT on streams)."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "say something about disaggregation"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    for _ in range(count):
        request = urllib.request.Request(
            router_url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert b"[DONE]" in response.read()


# -- a healthy 2P1D cluster behind pdkit's load balancer ------------------------------------


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("healthy")
    topology = write_topology(tmp, "healthy", prefill=2, prefill_env=SLOW_PREFILL)
    with running(topology, tmp) as cluster:
        for w in cluster.plan.workers:
            cluster.start_worker(w.name)
        cluster.start_router(PDKIT_LB_ADMIN_KEY=ADMIN_KEY)
        cluster.wait_healthy("prefill-0", "prefill-1", "decode-0")
        cluster.wait_router_ready()
        stream_completions(cluster.plan.router.url, 6)
        yield cluster


def test_health_is_ok_when_every_process_is_healthy(healthy):
    result = pdkit("health", str(healthy.topology), "--timeout", str(PROBE_TIMEOUT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: healthy: 3 workers and the pdkit router are healthy")


def test_status_json_shows_each_worker_and_the_router_with_traffic(healthy):
    data = status_json(healthy.topology)
    assert data["healthy"] is True and data["problems"] == []
    assert [(w["name"], w["state"]) for w in data["workers"]] == [
        ("prefill-0", "healthy"),
        ("prefill-1", "healthy"),
        ("decode-0", "healthy"),
    ]
    for w in data["workers"]:
        assert (w["engine"], w["version"], w["served_model"]) == ("sim", "0.5.23", SERVED)
        assert w["uptime_s"] is not None and w["uptime_s"] >= 0
        assert w["running"] is not None and w["queued"] is not None
        assert w["token_usage"] is not None and 0 <= w["token_usage"] <= 1
        assert w["kv"]["failed"] == 0
    prefill, decode = data["workers"][0], data["workers"][2]
    assert prefill["pd_queues"]["bootstrap"] is not None
    assert decode["pd_queues"]["transfer"] is not None
    router = data["router"]
    assert (router["kind"], router["state"], router["ready"]) == ("pdkit", "healthy", True)
    assert (router["healthy_prefill"], router["healthy_decode"]) == (2, 1)
    assert router["requests_total"] >= 6 and router["requests_per_s"] is not None
    assert router["ttft"]["count"] >= 6 and router["ttft"]["p50_ms"] > 0
    assert 0 <= router["ttft"]["within"] <= 1 and router["tpot"]["count"] > 0


def test_status_table_and_watch_refresh(healthy):
    table = pdkit("status", str(healthy.topology), "--timeout", str(PROBE_TIMEOUT))
    assert table.returncode == 0, table.stderr
    for text in ("prefill (2)", "decode (1)", "router pdkit", "all healthy", "sim 0.5.23"):
        assert text in table.stdout
    watch = pdkit(
        "status", str(healthy.topology), "--watch", "--count", "2", "--interval", "0.5", "--json"
    )
    assert watch.returncode == 0, watch.stderr
    rounds = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
    assert len(rounds) == 2 and rounds[1]["taken_at"] > rounds[0]["taken_at"]
    assert rounds[1]["router"]["requests_per_s"] is not None


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def post_json(url: str, body: dict) -> int | None:
    return http_status(url, body, timeout=60)


def admin(method: str, url: str, body: dict | None = None) -> int | None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return http_status(url, body, method=method, headers=auth, timeout=10)


def test_a_prefill_the_router_drains_is_draining_until_its_request_ends(healthy):
    """An operator removes a prefill at the router while it still prefills a long prompt."""
    router = healthy.plan.router.url
    body = {
        "input_ids": [9] * LONG_PROMPT,
        "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
    }
    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(post_json, router + "/generate", body)

        found: list[WorkerProcess] = []

        def busy_prefill() -> bool:
            # The long prompt's tokens, not a request count: the router's health probes are
            # requests too, a few tokens each and gone at once.
            for name in ("prefill-0", "prefill-1"):
                w = healthy.worker(name)
                loads = get_json(w.url + "/v1/loads?include=all")["loads"]
                tokens = sum(e["num_used_tokens"] + e["num_waiting_uncached_tokens"] for e in loads)
                if tokens >= LONG_PROMPT // 2:
                    found.append(w)
                    return True
            return False

        wait_until("a prefill working on the long prompt", busy_prefill)
        busy = found[-1]
        assert admin("DELETE", f"{router}/workers?url={busy.url}") == 202
        result = pdkit("health", str(healthy.topology), "--json", "--timeout", str(PROBE_TIMEOUT))
        assert result.returncode == 1
        data = json.loads(result.stdout)
        states = {w["name"]: w["state"] for w in data["workers"]}
        assert states[busy.name] == "draining"
        assert [p["line"] for p in data["problems"]] == [
            f"{busy.name} (127.0.0.1:{busy.http_port}): the router is draining it: no new requests"
        ]
        assert request.result(timeout=120) == 200  # the drained prefill finished its request
    # once drained the router forgets it: put it back as an operator would
    port = {"bootstrap_port": busy.bootstrap_port, "role": "prefill", "url": busy.url}
    # (the router removes a drained worker just after its last request ends: 409 until then)
    wait_until(
        "the router to take the prefill back",
        lambda: admin("POST", f"{router}/workers", port) == 201,
    )
    wait_until(
        "the prefill routable again", lambda: pdkit("health", str(healthy.topology)).returncode == 0
    )


def test_a_prefill_killed_mid_transfer_is_down_and_the_decode_counts_the_failure(healthy):
    """The PD protocol by hand (both legs, bootstrap fields), then the prefill dies while its
    decode waits for the KV: one problem line (prefill-1 down, exit 1), and the decode's
    failed transfer shown as a warning and in the JSON."""
    prefill, decode = healthy.worker("prefill-1"), healthy.worker("decode-0")
    body = {
        "input_ids": [7] * LONG_PROMPT,
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": 4242,
    }
    before = status_json(healthy.topology)["workers"][2]["kv"]["failed"]
    with ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(post_json, w.url + "/generate", body) for w in (prefill, decode)]

        def waiting_for_kv() -> bool:
            loads = get_json(decode.url + "/v1/loads?include=all")["loads"]
            return sum(e["disaggregation"]["decode_transfer_queue_reqs"] for e in loads) > 0

        wait_until("the decode waiting for the KV", waiting_for_kv)
        healthy.kill("prefill-1")
        assert legs[1].result(timeout=60) in range(500, 600)  # it fails, it does not hang
    try:
        result = pdkit("health", str(healthy.topology), "--timeout", str(PROBE_TIMEOUT))
        assert result.returncode == 1
        lines = result.stdout.splitlines()
        problems = [line for line in lines if not line.startswith("warning")]
        assert len(problems) == 1
        assert problems[0].startswith(
            f"prefill-1 (127.0.0.1:{prefill.http_port}): connection refused"
        )
        assert any(
            line.startswith(f"warning: decode-0 (127.0.0.1:{decode.http_port}): ")
            and "KV transfer(s) failed" in line
            for line in lines
        )
        data = json.loads(pdkit("health", str(healthy.topology), "--json").stdout)
        assert [w["state"] for w in data["workers"]] == ["healthy", "down", "healthy"]
        assert data["workers"][2]["kv"]["failed"] == before + 1
    finally:
        healthy.start_worker("prefill-1")
        healthy.wait_healthy("prefill-1")


# -- one worker serving another model, one still loading: no healthy decode ----------------


def test_wrong_model_still_loading_and_no_healthy_decode(tmp_path):
    topology = write_topology(tmp_path, "broken", decode_env={"PDKIT_SIM_LOAD_SECONDS": "120"})
    with running(topology, tmp_path) as cluster:

        def other_model(argv: list[str]) -> list[str]:
            at = argv.index("--served-model-name")
            return [*argv[: at + 1], "another-model", *argv[at + 2 :]]

        cluster.start_worker("prefill-0", edit=other_model)
        cluster.start_worker("decode-0")  # PDKIT_SIM_LOAD_SECONDS=120 from the topology
        cluster.start_router()
        cluster.wait_healthy("prefill-0")
        decode = cluster.worker("decode-0").url + "/health"
        wait_until("decode answering 503", lambda: http_status(decode) == 503)
        cluster.wait_router_ready(ready=False)

        result = pdkit("health", str(topology), "--timeout", "2")
        assert result.returncode == 1
        lines = [line for line in result.stdout.splitlines() if not line.startswith("warning")]
        assert lines[0].startswith("prefill-0 (127.0.0.1:")
        assert (
            "not what the topology expects: serves model 'another-model', "
            f"the topology expects '{SERVED}'" in lines[0]
        )
        assert any(line.startswith("decode-0") and ": starting" in line for line in lines)
        assert any(line.endswith("not ready: no healthy decode") for line in lines)

        data = status_json(topology)
        states = {w["name"]: w["state"] for w in data["workers"]}
        assert states == {"prefill-0": "unhealthy", "decode-0": "starting"}
        assert data["router"]["ready"] is False and data["router"]["healthy_decode"] == 0


# -- the smg router ---------------------------------------------------------------------------


def test_smg_router_ready_then_no_healthy_decode(tmp_path):
    require_smg()
    topology = write_topology(tmp_path, "smg", router="smg")
    with running(topology, tmp_path) as cluster:
        for w in cluster.plan.workers:
            cluster.start_worker(w.name)
        cluster.wait_healthy("prefill-0", "decode-0")
        cluster.start_router()
        cluster.wait_router_ready()
        stream_completions(cluster.plan.router.url, 4)

        result = pdkit("health", str(topology), "--timeout", "2")
        assert result.returncode == 0, result.stdout + result.stderr
        router = status_json(topology)["router"]
        assert (router["kind"], router["state"], router["ready"]) == ("smg", "healthy", True)
        assert (router["healthy_prefill"], router["healthy_decode"]) == (1, 1)
        assert router["requests_total"] >= 4
        assert router["ttft"] is not None and router["ttft"]["count"] >= 4

        cluster.kill("decode-0")
        cluster.wait_router_ready(ready=False)
        result = pdkit("health", str(topology), "--timeout", "2")
        assert result.returncode == 1
        lines = [line for line in result.stdout.splitlines() if not line.startswith("warning")]
        assert lines[0].startswith("decode-0 (127.0.0.1:") and "connection refused" in lines[0]
        assert lines[-1].endswith("not ready: no healthy decode")
