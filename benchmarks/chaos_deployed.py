"""bench-chaos's rows on a deployment that `pdkit up` made: a copy of topologies/local.yaml (sim
workers under supervisord, pdkit's router, Ansible on this machine) under `pdkit bench` load
(streamed chats, BENCH_RATE requests/s), each operator action the command a user runs:

    up-restart-kill-decode   `pdkit restart TOPOLOGY decode` of the only decode (3 GPUs, none  2P1D
                             free: the router holds its role's requests), then a SIGKILL of
                             decode-0 (supervisord starts it again)
    up-kill-decode-stop-prefill  SIGKILL decode-0 and SIGSTOP prefill-0 at once; decode-0 is   2P2D
                             started again by supervisord, prefill-0 gets SIGCONT STOP_S later
    up-template-change       `pdkit up` after a change to pdkit's supervisord program         2P1D
                             template (PDKIT_PLAYBOOKS: a copy whose program.conf.j2 gives
                             every process one more environment variable): every process's
                             files change; each instance is replaced in turn, the router
                             handed over last

pdkit's router only (the hold and the handover are what these rows measure; smg has neither).
Counted over the whole load (from before the action to --tail-seconds after the deployment is
whole again): requests sent and failed (the bench's records), retried / migrated / held (the
router's /metrics, polled every 0.5 s and summed across a handover, whose new image counts from
0), TTFT and TPOT p99. Each deployment lives under .bench/chaos/<fault>-pdkit/ and is shut down
after its row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.chaos_rows import Row, counters, p99
from kit.deploy.routing import RouterAdmin, admin_key
from kit.deploy.state import TEMPLATES
from kit.hosts.playbook import PLAYBOOKS_ENV
from kit.topology.layout import STATE_DIR_NAME
from tests.support.local_deploy import (
    BENCH_RATE,
    UP_TIMEOUT_S,
    deploy_env,
    end_bench,
    pids,
    shut_down,
    start_bench,
    write_topology,
)
from tests.support.sim_launch import healthy

REPO = Path(__file__).resolve().parents[1]
DEPLOYED = {
    "up-restart-kill-decode": (2, 1),
    "up-kill-decode-stop-prefill": (2, 2),
    "up-template-change": (2, 1),
}
STOP_S = 15.0
"""The kill-decode-stop-prefill rows: how long prefill-0 stays stopped (issue 35's case)."""
BENCH_MAX_S = 900
"""The bench's duration: longer than any row; it is ended (SIGINT) once the row's action is."""
BACK_TIMEOUT_S = 180.0
TEMPLATE_LINE = 'environment=PDKIT_REVISION="{{ pdkit_process_revision }}"'
TEMPLATE_CHANGED = TEMPLATE_LINE + ',PDKIT_BENCH_CHAOS_TEMPLATE="2"'


@dataclass
class Deployment:
    topology: Path
    name: str
    data: dict[str, Any]
    folder: Path

    def url(self, role: str, index: int = 0) -> str:
        """A worker's URL (instance `index` of `role` takes the role's port + index)."""
        return f"http://127.0.0.1:{self.data[role]['port'] + index}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.data['router']['port']}"

    def admin(self) -> RouterAdmin:
        """The router's worker API, with the deployment's admin key (its state dir)."""
        state = self.topology.absolute().parent / STATE_DIR_NAME / self.name
        return RouterAdmin("pdkit", self.router_url, admin_key(state), 30.0)

    def pdkit(self, log: str, *args: str, env: dict[str, str] | None = None) -> str:
        """`pdkit ARGS` against it; its output, also in `log` under the folder; raises on a
        non-zero exit."""
        done = subprocess.run(
            [sys.executable, "-c", "from kit.cli import main; main()", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env or deploy_env(),
            timeout=UP_TIMEOUT_S * 2,
            check=False,
        )
        output = done.stdout + done.stderr
        (self.folder / log).write_text(output)
        if done.returncode != 0:
            raise RuntimeError(f"pdkit {' '.join(args)} failed; see {self.folder / log}")
        return output


class CounterWatch:
    """pdkit's router's counters summed over the run, across a handover (the new image's
    counters start from 0, so a value below the last seen one is a new image's count)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.total = {"retries": 0.0, "migrations": 0.0, "held": 0.0}
        self._last: dict[str, float] | None = None

    async def poll(self) -> None:
        try:
            now = await counters(self.url)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return  # between two images: the next poll counts what it missed
        if self._last is not None:
            for key, value in now.items():
                last = self._last[key]
                self.total[key] += value - last if value >= last else value
        self._last = now

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        await self.poll()


def deploy(fault: str, folder: Path) -> Deployment:
    """A copy of local.yaml with the row's counts (one GPU per instance, none free), up."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    name = f"chaos-{uuid.uuid4().hex[:6]}"
    topology, data = write_topology(folder, name)
    prefills, decodes = DEPLOYED[fault]
    data["prefill"]["count"] = prefills
    data["decode"]["count"] = decodes
    data["hosts"][0]["gpus"] = prefills + decodes
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    deployment = Deployment(topology, name, data, folder)
    deployment.pdkit("up.log", "up", str(topology))
    return deployment


async def back(d: Deployment, process: str, role: str, index: int, old_pid: int) -> None:
    """Until supervisord runs `process` again (a new PID), it answers /health and the router
    routes to it."""
    deadline = time.monotonic() + BACK_TIMEOUT_S
    while pids(d.topology, d.name).get(process, old_pid) == old_pid:
        if time.monotonic() > deadline:
            raise RuntimeError(f"supervisord did not start {process} again; see {d.folder}")
        await asyncio.sleep(0.2)
    url = d.url(role, index)
    while not await asyncio.to_thread(healthy, url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process} did not answer /health again; see {d.folder}")
        await asyncio.sleep(0.2)
    async with d.admin() as admin:
        await admin.wait_routed(url, max(deadline - time.monotonic(), 1.0))


async def restart_kill_decode(d: Deployment) -> None:
    await asyncio.to_thread(d.pdkit, "restart.log", "restart", str(d.topology), "decode")
    decode = pids(d.topology, d.name)["decode-0"]
    os.killpg(decode, signal.SIGKILL)
    await back(d, "decode-0", "decode", 0, decode)


async def kill_decode_stop_prefill(d: Deployment) -> None:
    running = pids(d.topology, d.name)
    prefill, decode = running["prefill-0"], running["decode-0"]
    os.killpg(prefill, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        os.killpg(decode, signal.SIGKILL)
        await back(d, "decode-0", "decode", 0, decode)
        await asyncio.sleep(max(STOP_S - (time.monotonic() - stopped), 0.0))
    finally:
        os.killpg(prefill, signal.SIGCONT)
    async with d.admin() as admin:
        await admin.wait_routed(d.url("prefill", 0), BACK_TIMEOUT_S)


async def template_change(d: Deployment) -> None:
    """`pdkit up` with pdkit's program template changed; every worker must have been replaced
    (a new PID; the router execs itself on its handover, keeping its PID)."""
    playbooks = d.folder / "playbooks"
    shutil.copytree(REPO / "playbooks", playbooks)
    template = playbooks / TEMPLATES / "program.conf.j2"
    text = template.read_text()
    if TEMPLATE_LINE not in text:
        raise RuntimeError(f"{template} no longer has the line this row changes: {TEMPLATE_LINE}")
    template.write_text(text.replace(TEMPLATE_LINE, TEMPLATE_CHANGED))
    before = pids(d.topology, d.name)
    env = {**deploy_env(), PLAYBOOKS_ENV: str(playbooks)}
    await asyncio.to_thread(d.pdkit, "up-template.log", "up", str(d.topology), env=env)
    after = pids(d.topology, d.name)
    kept = [p for p in before if p != "router" and after.get(p) == before[p]]
    if kept:
        raise RuntimeError(f"the template change did not replace {', '.join(kept)}; see {d.folder}")


ACTIONS = {
    "up-restart-kill-decode": restart_kill_decode,
    "up-kill-decode-stop-prefill": kill_decode_stop_prefill,
    "up-template-change": template_change,
}


async def run_deployed(fault: str, args: argparse.Namespace, log_dir: Path) -> Row:
    """One row: deploy, load, act, tail, count; the deployment shut down at the end."""
    prefills, decodes = DEPLOYED[fault]
    row = Row(fault, "pdkit", f"{prefills}P{decodes}D")
    d = deploy(fault, log_dir)
    out = d.folder / "bench"
    requests = str(int(BENCH_RATE * BENCH_MAX_S))
    bench = start_bench(d.topology, out, "--rate", str(BENCH_RATE), "--duration",
                        str(BENCH_MAX_S), "--requests", requests,
                        "--output-len", str(args.tokens))  # fmt: skip
    try:
        watch = CounterWatch(d.router_url)
        stop = asyncio.Event()
        watching = asyncio.create_task(watch.run(stop))
        await asyncio.sleep(args.warmup)
        await ACTIONS[fault](d)
        output = await asyncio.to_thread(end_bench, bench, args.tail_seconds, 150)
        stop.set()
        await watching
        (d.folder / "bench.log").write_text(output)
        if bench.returncode != 0:
            raise RuntimeError(f"pdkit bench failed; see {d.folder / 'bench.log'}")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
        await asyncio.to_thread(shut_down, d.topology, d.name)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    row.sent = len(records)
    for r in records:
        if not r["ok"]:
            row.failed += 1
            why = f"HTTP {r['status']}" if r.get("status") not in (0, 200) else r["error_kind"]
            row.errors[why] = row.errors.get(why, 0) + 1
    row.retried = f"{watch.total['retries']:.0f}"
    row.migrated = f"{watch.total['migrations']:.0f}"
    row.held = f"{watch.total['held']:.0f}"
    ttfts = [r["ttft_ms"] / 1000 for r in records if r.get("ttft_ms") is not None]
    tpots = [r["tpot_ms"] / 1000 for r in records if r.get("tpot_ms") is not None]
    row.ttft_p99, row.tpot_p99 = p99(ttfts), p99(tpots)
    return row
