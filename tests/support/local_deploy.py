"""Helpers for the end-to-end tests that deploy a copy of topologies/local.yaml: its own name,
root and free ports (never a developer's `make up`), `pdkit` run against it, its layout and the
PIDs its supervisord runs, a chat request through the router, `pdkit bench` load in the
background, and the processes that belong to a deployment. The fixture that deploys one is in
tests/e2e/conftest.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import xmlrpc.client
from pathlib import Path

import yaml

from kit.deploy.services import supervisor_processes, supervisor_proxy
from kit.topology.layout import HostLayout, host_root
from tests.conftest import REPO, run_pdkit
from tests.support.ports import free_ports

API_KEY = "e2e-router-key-93f1c2"
API_KEY_ENV = "PDKIT_E2E_KEY"
"""The router's API key comes from this environment variable (see write_topology)."""

UP_TIMEOUT_S = 240
"""Seconds a `pdkit up` of a local sim deployment may take (Ansible on 2 loaded cores)."""

BENCH_RATE = 4.0
BENCH_S = 75.0
"""The steady load of bench_under_load: requests/s, and seconds it sends for."""


def write_topology(folder: Path, name: str) -> tuple[Path, dict]:
    """A copy of local.yaml in `folder`: own name, root, ports and a router API key."""
    data = yaml.safe_load((REPO / "topologies" / "local.yaml").read_text())
    prefill, bootstrap, decode, router = free_ports(4)
    data["name"] = name
    data["hosts"][0]["root"] = f".pdkit/{name}/root"
    data["prefill"]["port"] = prefill  # prefill-1 takes prefill + 1
    data["prefill"]["bootstrap_port"] = bootstrap
    data["decode"]["port"] = decode
    data["router"]["port"] = router
    data["router"]["api_key_env"] = API_KEY_ENV
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def deploy_env() -> dict[str, str]:
    """This environment for pdkit commands against a test deployment: the router's API key in
    API_KEY_ENV, and no PDKIT_STATE_DIR of the caller's (the state goes beside the topology)."""
    env = {k: v for k, v in os.environ.items() if k != "PDKIT_STATE_DIR"}
    env[API_KEY_ENV] = API_KEY
    return env


def pdkit(*args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`pdkit ARGS` as a user runs it, in deploy_env(); never raises on a non-zero exit."""
    return run_pdkit(*args, timeout=timeout, env=deploy_env())


def layout(topology: Path, name: str) -> HostLayout:
    """The deployment's layout on its one host (root `.pdkit/<name>/root`, see write_topology)."""
    return HostLayout(name, host_root(f".pdkit/{name}/root", topology.absolute().parent))


def pids(topology: Path, name: str) -> dict[str, int]:
    """{process: PID} of what the deployment's supervisord runs (starting or running)."""
    view = supervisor_processes(layout(topology, name).supervisord_socket)
    assert view is not None, "supervisord of the deployment does not answer"
    return {n: info.pid for n, info in view.items() if info.state in ("STARTING", "RUNNING")}


def chat(base_url: str, stream: bool) -> str:
    """One chat completion through the router with the openai client; the reply's text."""
    from openai import OpenAI  # noqa: PLC0415

    client = OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, timeout=60, max_retries=0)
    messages = [{"role": "user", "content": "Say hello."}]
    if not stream:
        reply = client.chat.completions.create(
            model="llama-3.1-8b", messages=messages, max_tokens=16
        )
        return reply.choices[0].message.content or ""
    parts = []
    for chunk in client.chat.completions.create(
        model="llama-3.1-8b", messages=messages, max_tokens=16, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def processes_of(name: str) -> list[int]:
    """PIDs of every process whose environment says it belongs to deployment `name`."""
    found = []
    marker = f"PDKIT_DEPLOYMENT={name}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry))
    return found


def shut_down(topology: Path, name: str, timeout_s: float = 90) -> None:
    """A test's cleanup of deployment `name`: its supervisord shut down with every process it
    runs (what `pdkit down`'s last play does, without Ansible's seconds of CPU per play; the
    tests of `pdkit down` itself run it). Fails if a process of it is left."""
    with contextlib.suppress(OSError, xmlrpc.client.Error, http.client.HTTPException):
        supervisor_proxy(layout(topology, name).supervisord_socket).supervisor.shutdown()
    socket_path = layout(topology, name).supervisord_socket
    deadline = time.monotonic() + timeout_s
    while (left := processes_of(name)) or supervisor_processes(socket_path) is not None:
        if time.monotonic() > deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"processes of {name} left {timeout_s:g} s after shutdown: {left}")
        time.sleep(0.1)


def start_bench(topology: Path, out: Path, *args: str) -> subprocess.Popen[str]:
    """`pdkit bench TOPOLOGY ARGS --no-predict --json --out OUT` in the background, in
    deploy_env()."""
    argv = ["bench", str(topology), *args, "--no-predict", "--json", "--out", str(out)]
    return subprocess.Popen(
        [sys.executable, "-c", "from kit.cli import main; main()", *argv],
        cwd=REPO,
        env=deploy_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def end_bench(bench: subprocess.Popen[str], tail_s: float = 2.0, timeout: float = 120) -> str:
    """Let `bench` send `tail_s` more seconds, then stop it as Ctrl-C does (no new request; the
    ones in flight finish; results written): its output. Tests end their load once the live
    operation it covers has, rather than waiting out the bench's duration."""
    time.sleep(tail_s)
    if bench.poll() is None:
        bench.send_signal(signal.SIGINT)
    output, _ = bench.communicate(timeout=timeout)
    return output


def assert_load_covered(out: Path, ended: float) -> None:
    """The bench of bench_under_load whose results are in `out` sent requests until `ended`
    (unix time: the end of the live operation it covers), or until its BENCH_S ran out on a
    machine slow enough that the operation outlasted it. In the bench's own clock: its start-up
    (seconds on a loaded machine) is not counted against it."""
    started = json.loads((out / "summary.json").read_text())["started_at"]
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert records, "the bench sent no request"
    last = started + max(r["sent_s"] for r in records)
    assert last > min(ended, started + BENCH_S) - 3, (last - started, ended - started)


def bench_under_load(topology: Path, out: Path) -> subprocess.Popen[str]:
    """BENCH_RATE requests/s for BENCH_S seconds of 32 output tokens, in the background: the
    load that live operations (scaling, restarts) must not fail a request of."""
    requests = str(int(BENCH_RATE * BENCH_S))
    return start_bench(topology, out, "--rate", str(BENCH_RATE), "--duration", str(BENCH_S),
                       "--requests", requests, "--output-len", "32")  # fmt: skip
