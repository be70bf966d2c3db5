"""`make bench-chaos`: what a worker fault costs the clients, pdkit's router against smg 1.13.

For each router and each fault, a fresh local sim deployment (`python -m kit.sim` workers,
the real PD protocol over Mooncake TCP emulation) behind the router, under a steady open-loop
load of streamed `/generate` requests (`input_ids` prompts, so a cut stream can be continued
exactly), and one fault injected after a warm-up:

    kill-prefill    SIGKILL a prefill; it comes back 1 s later on its port (as supervisord
                    restarts it)                                              2P2D
    stop-prefill    SIGSTOP a prefill for --stop-seconds, then SIGCONT        2P2D
    kill-decode     SIGKILL a decode; back 1 s later                          2P2D
    stop-decode     SIGSTOP a decode for --stop-seconds, then SIGCONT         2P2D
    kill-only-decode  the same as kill-decode with one decode                 2P1D
    restart-only-decode  SIGTERM the only decode, start it again at once      2P1D
                    (what `pdkit restart` does to it, without the drain)
    kill-decode-stop-prefill  SIGKILL decode-0 (back 1 s later) and SIGSTOP prefill-0     2P2D
                    for 15 s (SIGCONT then), at once
    kill-rank       each decode a 2-node instance (TP 2 over two sim ranks, each under its
                    rank group's agent, `python -m kit.ranks`, as `pdkit up` runs them);
                    SIGKILL node rank 1 of decode-0: its agents restart both ranks, rank 0
                    first, with no command (the failures column says how long decode-0's
                    rank 0 did not answer /health)                           2P2D
Operator actions, as `pdkit restart` and `pdkit up` make them through the router's API (the
same `kit.deploy.routing.RouterAdmin`), without Ansible:
    replace-only-decode  the only decode out of the router (pdkit's: listed as     2P1D
                    returning, its role held; smg: removed), stopped, started, added back
    restart-router  pdkit's router: SIGUSR2 (its handover: a new image on the   2P1D
                    same socket); smg: SIGTERM, then started again
    upgrade         `pdkit upgrade` without its gate: every worker in its order   2P1D
                    (prefills, then the only decode) replaced as replace-only-decode
                    replaces one, started again with a new flag (`--revision v2`)

On a deployment made by `pdkit up` (benchmarks/chaos_deployed.py: local.yaml's sim workers
under supervisord, Ansible, `pdkit bench` load), the commands a user runs; pdkit's router only:
    up-restart-kill-decode  `pdkit restart TOPOLOGY decode` of the only decode, then   2P1D
                    SIGKILL of it (supervisord starts it again)
    up-kill-decode-stop-prefill  SIGKILL decode-0 and SIGSTOP prefill-0 for 15 s      2P2D
    up-template-change  `pdkit up` after a change to pdkit's supervisord program        2P1D
                    template: every instance replaced in turn, the router handed over

One row per (fault, router): requests sent during the fault window (from the fault to
--tail-seconds after the worker is back), failed (an HTTP error, an error event, a broken or
timed-out stream), and for pdkit the router's own counts over the run (retried, migrated,
held, from /metrics; after restart-router, the new image's only); TTFT and TPOT p99 over the
window. smg has no such counters (n/a). For the operator rows that replace workers, each role's
time below its instance count (out of the router until routed to again), in seconds.

Ports come from --port-base (default 44600, the range hand-started servers use here). Logs
go to .bench/chaos/. Subsets: --faults, --routers; --rate, --tokens, --stop-seconds.
`--route chat` sends streamed `/v1/chat/completions` instead (what `pdkit bench` sends: a
shared system prompt and a question each); pdkit's router then gets `--prompt-tokens
sim:VOCAB`, so that it knows the prompt ids and follows the streams (kit/lb/openai_stream.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.chaos_deployed import DEPLOYED, STOP_S, run_deployed
from benchmarks.chaos_rows import Row, counters, ms, p99
from kit.deploy.routing import RouterAdmin
from kit.perf.models import resolve_model
from tests.support.local_deploy import BENCH_RATE
from tests.support.sim_launch import SimProcess, healthy, worker_argv

REPO = Path(__file__).resolve().parents[1]
LOG_DIR = REPO / ".bench" / "chaos"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_GPU": "H100-SXM"}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # worker_argv's, the sims' emulated model
SYSTEM_PROMPT = " ".join(["You answer questions about a long shared document, briefly."] * 40)
FAULTS = {
    "kill-prefill": (2, 2),
    "stop-prefill": (2, 2),
    "kill-decode": (2, 2),
    "stop-decode": (2, 2),
    "kill-only-decode": (2, 1),
    "restart-only-decode": (2, 1),
    "replace-only-decode": (2, 1),
    "restart-router": (2, 1),
    "upgrade": (2, 1),
    "kill-decode-stop-prefill": (2, 2),
    "kill-rank": (2, 2),
}
RANK_GROUP_RESTART_S = "2"
"""The agents' restart delay (the playbooks' pdkit_process_rank_group_restart_seconds)."""
ADMIN_KEY = "bench-chaos-admin"
"""pdkit's router's admin key here (its worker API, which replace-only-decode uses)."""
ROUTERS = ("pdkit", "smg")


@dataclass
class Result:
    """One request as the client saw it (times in s, monotonic)."""

    sent: float
    ok: bool = False
    error: str = ""
    ttft: float | None = None
    tpot: float | None = None


class Cluster:
    """Sim workers and one router on fixed ports from `base`."""

    def __init__(
        self,
        prefills: int,
        decodes: int,
        router: str,
        base: int,
        log_dir: Path,
        *,
        chat: bool,
        ranks: bool = False,
    ) -> None:
        self.router = router
        self.chat = chat
        self.log_dir = log_dir
        self.workers: list[SimProcess] = []
        self.prefill: list[SimProcess] = []
        self.decode: list[SimProcess] = []
        gpu = 0
        for i in range(prefills):
            argv = worker_argv(
                port=base + i,
                mode="prefill",
                bootstrap_port=base + 50 + i,
                extra=["--base-gpu-id", str(gpu)],
            )
            self.prefill.append(SimProcess(argv, env=SIM_ENV, log_dir=log_dir))
            gpu += 1
        self.followers: list[SimProcess] = []
        """kill-rank: node rank 1 of each decode (rank 0 is in `decode`)."""
        self.away_s: float | None = None
        for i in range(decodes):
            argv = worker_argv(port=base + 20 + i, mode="decode", extra=["--base-gpu-id", str(gpu)])
            if not ranks:
                self.decode.append(SimProcess(argv, env=SIM_ENV, log_dir=log_dir))
                gpu += 1
                continue
            dist = base + 100 + 50 * i  # the group's port: dist-init + 40, as the Plan has it
            for rank in (0, 1):
                extra = ["--tp", "2", "--nnodes", "2", "--node-rank", str(rank)]
                extra += ["--dist-init-addr", f"127.0.0.1:{dist}", "--base-gpu-id", str(gpu)]
                group = ["--leader", f"127.0.0.1:{dist + 40}", "--node-rank", str(rank)]
                group += ["--nnodes", "2", "--restart-delay", RANK_GROUP_RESTART_S]
                argv = worker_argv(port=base + 20 + 10 * rank + i, mode="decode", extra=extra)
                member = SimProcess(argv, env=SIM_ENV, log_dir=log_dir, group=group)
                (self.followers if rank else self.decode).append(member)
                gpu += 1
        self.workers = [*self.prefill, *self.decode, *self.followers]
        self.port = base + 90
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._base = base

    def bootstrap_port(self, worker: SimProcess) -> int | None:
        """A prefill's bootstrap port (None for a decode)."""
        if worker not in self.prefill:
            return None
        return self._base + 50 + self.prefill.index(worker)

    def router_argv(self) -> list[str]:
        workers: list[str] = []
        for i, p in enumerate(self.prefill):
            workers += ["--prefill", p.url, str(self._base + 50 + i)]
        for d in self.decode:
            workers += ["--decode", d.url]
        listen = ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.router == "pdkit":
            # health probes every second, as a deployment with `router.args: {health-interval: 1}`
            tokens = ["--prompt-tokens", f"sim:{resolve_model(MODEL).vocab}"] if self.chat else []
            lb = [sys.executable, "-m", "kit.lb", *workers, *listen, *tokens]
            return [*lb, "--health-interval", "1"]
        smg = os.environ.get("PDKIT_SMG", str(REPO / ".venv-smg/bin/smg"))
        # what kit.plan.router renders for smg from the topology's default router.faults
        faults = ["--retry-max-retries", "4", "--retry-initial-backoff-ms", "50"]
        faults += ["--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "1"]
        metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(self._base + 91)]
        health = ["--health-check-interval-secs", "1"]
        return [smg, "launch", "--pd-disaggregation", *workers, *listen, *metrics, *faults, *health]

    async def start(self) -> None:
        for w in self.workers:
            w.start()
        for w in self.workers:
            await asyncio.to_thread(w.wait_ready, 60.0)
        await self.start_router()
        await asyncio.sleep(2.0)  # let every worker pass its probes

    async def start_router(self) -> None:
        """Start the router (appending to its log) and wait for its /readiness."""
        with (self.log_dir / f"router-{self.router}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                self.router_argv(),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PDKIT_LB_ADMIN_KEY": ADMIN_KEY},
            )
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(self.url + "/readiness") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.2)
        raise RuntimeError(f"router {self.router} did not get ready; see {self.log_dir}")

    def stop_router(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def stop(self) -> None:
        self.stop_router()
        for w in self.workers:
            w.kill(signal.SIGCONT)
            w.stop(grace_s=2.0)


def request_body(tokens: int, seq: int, chat: bool) -> tuple[str, dict[str, object]]:
    """(route, body) of request `seq`: a 256-id /generate prompt, or a chat."""
    if chat:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Question {seq}: what happened on day {seq % 97}?"},
        ]
        return "/v1/chat/completions", {"messages": messages, "max_tokens": tokens, "stream": True}
    prompt = [(seq * 31 + i) % 30000 + 100 for i in range(256)]
    return "/generate", {
        "input_ids": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": tokens},
    }


async def one_request(
    session: aiohttp.ClientSession, url: str, tokens: int, seq: int, chat: bool = False
) -> Result:
    result = Result(time.monotonic())
    route, body = request_body(tokens, seq, chat)
    times: list[float] = []
    try:
        async with session.post(
            url + route, json=body, timeout=aiohttp.ClientTimeout(total=120)
        ) as r:
            if r.status != 200:
                result.error = f"HTTP {r.status}"
                await r.read()
                return result
            done = False
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                if b'"error"' in payload[:12]:
                    result.error = "error event"
                    return result
                times.append(time.monotonic())
            if not done:
                result.error = "stream cut"
                return result
    except (aiohttp.ClientError, TimeoutError) as exc:
        result.error = type(exc).__name__
        return result
    result.ok = bool(times)
    if times:
        result.ttft = times[0] - result.sent
        if len(times) > 1:
            result.tpot = (times[-1] - times[0]) / (len(times) - 1)
    return result


async def restart_router(c: Cluster) -> None:
    """pdkit's router: SIGUSR2, until /health names a newer image; smg: SIGTERM, start again."""
    if c.router != "pdkit":
        await asyncio.to_thread(c.stop_router)
        await c.start_router()
        return
    admin = RouterAdmin("pdkit", c.url, ADMIN_KEY, 30.0)
    async with admin:
        before = await admin.started()
        assert c.proc is not None and before is not None
        c.proc.send_signal(signal.SIGUSR2)
        await admin.wait_started_after(before, 60.0)


async def replace(c: Cluster, victim: SimProcess, role: str, extra: tuple[str, ...] = ()) -> float:
    """What `pdkit restart` does to a worker (the only decode: the hold, no stand-in), by the
    router's API: out (pdkit's router: returning), stopped, started (with `extra` flags added),
    added back, routed to. Returns the seconds it was out of the router."""
    admin = RouterAdmin(c.router, c.url, ADMIN_KEY, 30.0)
    async with admin:
        began = time.monotonic()
        await admin.remove(victim.url, back_within=60.0)
        await asyncio.to_thread(victim.stop, 10.0)
        victim.argv = [*victim.argv, *extra]
        victim.start()
        await asyncio.to_thread(victim.wait_ready, 60.0)
        await admin.add(victim.url, role, c.bootstrap_port(victim))
        await admin.wait_routed(victim.url, 60.0)
        return time.monotonic() - began


async def upgrade(c: Cluster, row: Row) -> None:
    """`pdkit upgrade`'s order (prefills, then decodes), one at a time, each with a new flag."""
    for role, workers in (("prefill", c.prefill), ("decode", c.decode)):
        for victim in workers:
            away = await replace(c, victim, role, ("--revision", "v2"))
            row.below[role] = row.below.get(role, 0.0) + away


async def kill_rank(c: Cluster) -> None:
    """SIGKILL node rank 1 of decode-0 (the sim under its agent); back when rank 0 answers
    /health again after its agents restarted both ranks. Sets `c.away_s`."""
    agent = c.followers[0].proc
    assert agent is not None
    children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)
    killed = time.monotonic()
    rank0 = c.decode[0].url
    away = None
    while time.monotonic() - killed < 120:
        up = await asyncio.to_thread(healthy, rank0)
        if away is None and not up:
            away = time.monotonic()
        elif away is not None and up:
            c.away_s = time.monotonic() - away
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"decode-0 did not come back within 120 s; see {c.log_dir}")


async def kill_decode_stop_prefill(c: Cluster) -> None:
    """SIGSTOP prefill-0 and SIGKILL decode-0 together; decode-0 back 1 s after it died,
    prefill-0 SIGCONTed STOP_S after it stopped."""
    prefill, decode = c.prefill[0], c.decode[0]
    prefill.kill(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        decode.kill(signal.SIGKILL)
        await asyncio.to_thread(decode.proc.wait, 10)  # type: ignore[union-attr]
        await asyncio.sleep(1.0)  # supervisord's restart delay, about
        decode.start()
        await asyncio.to_thread(decode.wait_ready, 60.0)
        await asyncio.sleep(max(STOP_S - (time.monotonic() - stopped), 0.0))
    finally:
        prefill.kill(signal.SIGCONT)


async def inject(fault: str, c: Cluster, stop_s: float, row: Row) -> None:
    """The fault; returns when the worker is back."""
    if fault == "kill-rank":
        await kill_rank(c)
        return
    if fault == "restart-router":
        await restart_router(c)
        return
    if fault == "replace-only-decode":
        row.below["decode"] = await replace(c, c.decode[0], "decode")
        return
    if fault == "upgrade":
        await upgrade(c, row)
        return
    if fault == "kill-decode-stop-prefill":
        await kill_decode_stop_prefill(c)
        return
    victim = c.prefill[0] if fault in {"kill-prefill", "stop-prefill"} else c.decode[0]
    if fault.startswith("stop"):
        victim.kill(signal.SIGSTOP)
        await asyncio.sleep(stop_s)
        victim.kill(signal.SIGCONT)
        return
    if fault.startswith("kill"):
        victim.kill(signal.SIGKILL)
        await asyncio.to_thread(victim.proc.wait, 10)  # type: ignore[union-attr]
        await asyncio.sleep(1.0)  # supervisord's restart delay, about
    else:  # restart: SIGTERM, then start again
        await asyncio.to_thread(victim.stop, 10.0)
    victim.start()
    await asyncio.to_thread(victim.wait_ready, 60.0)


async def run_case(fault: str, router: str, args: argparse.Namespace) -> Row:
    prefills, decodes = FAULTS[fault]
    log_dir = LOG_DIR / f"{fault}-{router}"
    log_dir.mkdir(parents=True, exist_ok=True)
    chat = args.route == "chat"
    c = Cluster(
        prefills, decodes, router, args.port_base, log_dir, chat=chat, ranks=fault == "kill-rank"
    )
    row = Row(fault, router, f"{prefills}P{decodes}D")
    try:
        await c.start()
        before = await counters(c.url) if router == "pdkit" else None
        if before is not None and fault == "restart-router":
            before = dict.fromkeys(before, 0.0)  # the new image counts from 0 (its own only)
        results: list[Result] = []
        tasks: set[asyncio.Task[Result]] = set()
        window: list[float] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            def finished(task: asyncio.Task[Result]) -> None:
                tasks.discard(task)
                results.append(task.result())

            async def load(until: asyncio.Event) -> None:
                seq = 0
                gap = 1.0 / args.rate
                nxt = time.monotonic()
                while not until.is_set():
                    task = asyncio.create_task(
                        one_request(session, c.url, args.tokens, seq, args.route == "chat")
                    )
                    tasks.add(task)
                    task.add_done_callback(finished)
                    seq += 1
                    nxt += gap
                    await asyncio.sleep(max(nxt - time.monotonic(), 0))

            stop = asyncio.Event()
            loader = asyncio.create_task(load(stop))
            await asyncio.sleep(args.warmup)
            window.append(time.monotonic())
            await inject(fault, c, args.stop_seconds, row)
            await asyncio.sleep(args.tail_seconds)
            window.append(time.monotonic())
            stop.set()
            await loader
            if tasks:
                await asyncio.wait(tasks, timeout=150)
        if before is not None:
            after = await counters(c.url)
            row.retried = f"{after['retries'] - before['retries']:.0f}"
            row.migrated = f"{after['migrations'] - before['migrations']:.0f}"
            row.held = f"{after['held'] - before['held']:.0f}"
        inside = [r for r in results if window[0] <= r.sent <= window[1]]
        row.sent = len(inside)
        failed = [r for r in inside if not r.ok]
        row.failed = len(failed)
        for r in failed:
            row.errors[r.error] = row.errors.get(r.error, 0) + 1
        row.ttft_p99 = p99([r.ttft for r in inside if r.ttft is not None])
        row.tpot_p99 = p99([r.tpot for r in inside if r.tpot is not None])
        row.away_s = c.away_s
    finally:
        c.stop()
    return row


def table(rows: list[Row], args: argparse.Namespace) -> str:
    what = (
        "streamed chats (a shared system prompt, one question each)"
        if args.route == "chat"
        else "streamed /generate with 256-token prompts"
    )
    lines = [
        f"bench-chaos: {args.rate:g} req/s of {what} ({args.tokens} tokens), fault after "
        f"{args.warmup:g} s, SIGSTOP {args.stop_seconds:g} s, window = fault "
        f"to {args.tail_seconds:g} s after the worker is back",
    ]
    if any(r.fault in DEPLOYED for r in rows):
        lines.append(
            f"up-* rows: a deployment made by `pdkit up`, under `pdkit bench` ({BENCH_RATE:g} "
            f"req/s of streamed chats, {args.tokens} tokens); counted over the whole load, "
            f"from {args.warmup:g} s before the action to {args.tail_seconds:g} s after it"
        )
    lines += [
        "",
        "| fault | shape | router | sent | failed | retried | migrated | held | below count s "
        "| TTFT p99 ms | TPOT p99 ms | failures |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or ""
        below = ", ".join(f"{role} {s:.1f}" for role, s in r.below.items()) or "-"
        if r.away_s is not None:
            why = f"decode-0 away {r.away_s:.1f} s" + (f"; {why}" if why else "")
        lines.append(
            f"| {r.fault} | {r.shape} | {r.router} | {r.sent} | {r.failed} | {r.retried} | "
            f"{r.migrated} | {r.held} | {below} | {ms(r.ttft_p99)} | {ms(r.tpot_p99)} | {why} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    rows = []
    for fault in args.faults:
        if fault in DEPLOYED:  # pdkit's router only (see chaos_deployed)
            if "pdkit" in args.routers:
                print(f"-- {fault} / pdkit (pdkit up)", file=sys.stderr, flush=True)
                rows.append(await run_deployed(fault, args, LOG_DIR / f"{fault}-pdkit"))
            continue
        for router in args.routers:
            print(f"-- {fault} / {router}", file=sys.stderr, flush=True)
            rows.append(await run_case(fault, router, args))
    text = table(rows, args)
    print(text)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    (LOG_DIR / "report.md").write_text(text + "\n")
    (LOG_DIR / "rows.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    every = [*FAULTS, *DEPLOYED]
    p.add_argument("--faults", nargs="+", default=every, choices=every)
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS))
    p.add_argument("--rate", type=float, default=8.0, help="requests per second (default 8)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per stream (default 64)")
    p.add_argument("--warmup", type=float, default=4.0, help="s of load before the fault")
    p.add_argument("--stop-seconds", type=float, default=20.0, help="SIGSTOP length (default 20)")
    p.add_argument("--tail-seconds", type=float, default=5.0, help="s of load after recovery")
    p.add_argument("--port-base", type=int, default=44600)
    p.add_argument(
        "--route",
        choices=("generate", "chat"),
        default="generate",
        help="streamed /generate (default) or /v1/chat/completions",
    )
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
