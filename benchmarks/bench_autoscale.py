"""`make bench-autoscale`: does `pdkit autoscale` beat every static split of the same pool when
the workload shifts half way?

One sim deployment of 6 instances on one host of 6 emulated H100s (Llama-3.1-8B, every
instance started with enable-pd-role-switch; the model slowed by PDKIT_SIM_SPEED 0.25 with the
SLO stretched by the same factor, and 8 request slots per instance, so that this 2-core
machine holds the load; pdkit's router with --prefill-max-inflight 8, so that requests beyond a
prefill's slots wait in the router for the first prefill with room). The workload, in two
phases of `--phase` seconds each:

    A  short prompts, long answers     128 in / 256 out tokens at 2 req/s   (decodes are short)
    B  long prompts, short answers     3000 in / 8 out tokens at 6 req/s    (prefills are short)

is served once per static split of the pool, one after the other, on the same deployment (every
split from 1P5D to 5P1D, or with `--splits best` only the best for A and the best for B, both
chosen by kit/perf's model, the same one the autoscaler asks), then with `pdkit autoscale`
running from A's best split. The split is set between runs through the
runtime role switch. Printed per phase and run: goodput (requests/s meeting the SLO) and SLO
attainment, the whole run's goodput and its ratio to each static split's, failed requests, and
the autoscaler's moves; a timeline PNG (split and attainment over time, per run) and a JSON in
`--out`.

    python -m benchmarks.bench_autoscale [--phase 45] [--splits all|best] [--out .bench/autoscale]
    python -m benchmarks.bench_autoscale --steady 600 [--steady-mix RATE IN OUT]

`--steady` serves one steady workload instead, with the autoscaler on from the model's best
split for it, and counts its decisions and moves (no move is right).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.autoscale.apply import RoleSwitcher, splits
from kit.autoscale.decide import Mix, Split
from kit.autoscale.model import PoolModel
from kit.bench.predict import plan_cluster
from kit.deploy.routing import RouterAdmin
from kit.deploy.steps import router_key
from kit.hosts.context import DeployContext
from kit.plan.resolve import resolve
from kit.topology.load import parse_topology, read_topology_text
from tests.support.local_deploy import API_KEY, API_KEY_ENV, write_topology

REPO = Path(__file__).resolve().parents[1]
SPEED = 0.25
POOL = 6
PHASES = (
    ("A", 2.0, 128, 256),
    ("B", 6.0, 3000, 8),
)
"""(name, rate req/s, input tokens, output tokens)."""
BIN_S = 10.0
PREFILL_MAX_INFLIGHT = 8


def pdkit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PDKIT_STATE_DIR"}
    env[API_KEY_ENV] = API_KEY
    return subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
        check=False,
    )


@dataclass
class Run:
    name: str
    start: Split
    autoscale: bool
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    """(seconds from the run's start, prefills, decodes) every 2 s."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)


def free_block(size: int, taken: set[int]) -> int:
    """The first of `size` consecutive free ports (every instance of a role takes the next)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        block = set(range(base, base + size))
        if base + size < 65536 and not block & taken and all(_free(p) for p in block):
            taken |= block
            return base


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def deploy(folder: Path) -> tuple[Path, dict[str, Any]]:
    name = f"bench-auto-{uuid.uuid4().hex[:6]}"
    topology, data = write_topology(folder, name)
    # Any instance may serve either role: each role's ports, and the bootstrap ports every
    # switchable instance takes, are blocks of the pool's size.
    taken = {data["router"]["port"]}
    for role, key in (("prefill", "port"), ("prefill", "bootstrap_port"), ("decode", "port")):
        data[role][key] = free_block(POOL, taken)
    data["hosts"][0]["gpus"] = POOL
    data["prefill"]["count"], data["decode"]["count"] = 1, POOL - 1
    data["decode"].pop("args", None)
    data["defaults"] = {
        "args": {"page-size": 16, "max-running-requests": 8, "enable-pd-role-switch": True},
        "env": {"PDKIT_SIM_SPEED": str(SPEED)},
    }
    data["slo"] = {"ttft_ms": 400 / SPEED, "tpot_ms": 40 / SPEED, "attainment": 0.9}
    # The router keeps what a prefill cannot run at once (its 8 request slots): a prefill that
    # joins takes the waiting requests instead of the old ones keeping their queues.
    data["router"].setdefault("args", {})["prefill-max-inflight"] = PREFILL_MAX_INFLIGHT
    data["autoscale"] = {
        "interval_s": 6,
        "cooldown_s": 6,
        "max_step": 4,
        "min_requests": 8,
        "hysteresis": 0.15,
    }
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    return topology, data


Phase = tuple[str, float, int, int]


def best_splits(
    topology: Path, phases: tuple[Phase, ...] = PHASES
) -> dict[str, tuple[Split, dict[str, float]]]:
    """The model's best static split per phase, and every split's predicted goodput."""
    plan = resolve(topology)
    cluster, speed = plan_cluster(plan)
    parsed, _ = parse_topology(read_topology_text(topology))
    assert cluster.prefill is not None and cluster.decode is not None
    model = PoolModel(cluster.prefill.config, cluster.decode.config, parsed.slo, parsed, speed)
    out = {}
    for name, rate, prompt, output in phases:
        rated = model.goodputs(
            [Split(p, POOL - p) for p in range(1, POOL)], Mix(rate, prompt, output)
        )
        best = max(rated, key=lambda s: rated[s])
        out[name] = (best, {s.describe(): round(g, 2) for s, g in rated.items()})
    return out


def static_runs(best: dict[str, tuple[Split, dict[str, float]]], which: str) -> list[Run]:
    """The static runs: every split of the pool from the most decodes to the most prefills
    (`which` "all"), or only each phase's best ("best"); each named by the phases it is best
    for."""
    chosen = (
        [Split(p, POOL - p) for p in range(1, POOL)]
        if which == "all"
        else sorted({split for split, _ in best.values()})
    )
    runs = []
    for split in chosen:
        best_for = [name for name, (b, _) in best.items() if b == split]
        label = f" (best for {', '.join(best_for)})" if best_for else ""
        runs.append(Run(f"static {split.describe()}{label}", split, False))
    return runs


def watch(ctx: DeployContext, run: Run, began: float, stop: threading.Event) -> None:
    router = ctx.plan.router

    async def once() -> tuple[Split, Split]:
        async with RouterAdmin(router.kind, router.url, router_key(ctx), 5.0) as admin:
            return splits(ctx.plan, await admin.workers())

    while not stop.is_set():
        try:
            current, _ = asyncio.run(once())
            run.timeline.append((time.monotonic() - began, current.prefill, current.decode))
        except Exception:
            pass
        stop.wait(2.0)


def serve(
    topology: Path,
    ctx: DeployContext,
    run: Run,
    phase_s: float,
    out: Path,
    *,
    phases: tuple[Phase, ...] = PHASES,
) -> None:
    switcher = RoleSwitcher(ctx)
    router = ctx.plan.router

    async def now() -> Split:
        async with RouterAdmin(router.kind, router.url, router_key(ctx), 5.0) as admin:
            return splits(ctx.plan, await admin.workers())[0]

    current = asyncio.run(now())
    if current != run.start:
        moved = switcher.move(current, run.start)
        print(f"  {run.name}: set {run.start.describe()}: " + "; ".join(m.line() for m in moved))
    time.sleep(3)
    stop = threading.Event()
    began = time.monotonic()
    watcher = threading.Thread(target=watch, args=(ctx, run, began, stop), daemon=True)
    watcher.start()
    scaler = None
    log = out / f"{run.name}-autoscale.log"
    if run.autoscale:
        env = {k: v for k, v in os.environ.items() if k != "PDKIT_STATE_DIR"}
        env[API_KEY_ENV] = API_KEY
        with log.open("w") as handle:
            scaler = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from kit.cli import main; main()",
                    "autoscale",
                    str(topology),
                ],
                cwd=REPO,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    try:
        for name, rate, prompt, output in phases:
            if scaler is not None and scaler.poll() is not None:
                raise RuntimeError(f"pdkit autoscale exited: {log.read_text()[-2000:]}")
            folder = out / f"{run.name}-{name}"
            offset = time.monotonic() - began
            args = ["bench", str(topology), "--rate", str(rate), "--duration", str(phase_s)]
            args += ["--requests", str(int(rate * phase_s)), "--input-len", str(prompt)]
            args += ["--output-len", str(output), "--warmup", "0", "--no-predict"]
            args += ["--timeout", "120", "--out", str(folder), "--label", f"{run.name}-{name}"]
            result = pdkit(*args, timeout=phase_s + 300)
            if result.returncode != 0:
                print(result.stdout[-2000:], result.stderr[-2000:])
            point = json.loads((folder / "summary.json").read_text())["points"][0]
            wall = time.monotonic() - began - offset
            run.phases[name] = {
                "requests": point["requests"],
                "ok": point["ok"],
                "good": point["good"],
                "attainment": point["attainment"],
                "goodput_rps": point["good"] / wall,
                "seconds": wall,
            }
            for line in (folder / "requests.jsonl").open():
                record = json.loads(line)
                record["t"] = offset + record["sent_s"]
                record["phase"] = name
                run.requests.append(record)
    finally:
        if scaler is not None:
            scaler.send_signal(signal.SIGINT)
            try:
                scaler.wait(30)
            except subprocess.TimeoutExpired:
                scaler.kill()
            run.moves = [line.strip() for line in log.read_text().splitlines() if " move " in line]
        stop.set()
        watcher.join(10)


def attainment_bins(run: Run, slo: dict[str, float]) -> list[tuple[float, float]]:
    bins: dict[int, list[bool]] = {}
    for r in run.requests:
        good = bool(
            r["ok"]
            and r["ttft_ms"] is not None
            and r["ttft_ms"] <= slo["ttft_ms"]
            and (r["tpot_ms"] or 0) <= slo["tpot_ms"]
        )
        bins.setdefault(int(r["t"] // BIN_S), []).append(good)
    if not bins:
        return []
    # A window in which no request was sent (a run waits for phase A's last answer before it
    # starts phase B) is NaN: a gap in the line, not a line drawn across it.
    return [
        ((k + 0.5) * BIN_S, sum(bins[k]) / len(bins[k]) if k in bins else math.nan)
        for k in range(max(bins) + 1)
    ]


def plot(runs: list[Run], slo: dict[str, float], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for run in runs:
        times = [t for t, _, _ in run.timeline]
        axes[0].step(times, [p for _, p, _ in run.timeline], where="post", label=run.name)
        bins = attainment_bins(run, slo)
        axes[1].plot([t for t, _ in bins], [a * 100 for _, a in bins], marker="o", label=run.name)
    for index, run in enumerate(runs):
        # Each run's phase B starts when its phase A's last request finished.
        if "A" in run.phases:
            for ax in axes:
                ax.axvline(
                    run.phases["A"]["seconds"],
                    color=f"C{index}",
                    linestyle="--",
                    linewidth=1,
                )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel(f"prefill instances (of {POOL})")
    axes[0].set_title("Split over time (dashed, per run: the workload shifts from A to B)")
    axes[1].set_ylabel(f"SLO attainment per {BIN_S:.0f} s (%)")
    axes[1].set_xlabel("seconds from the start of the run (a gap: no request sent in that window)")
    axes[1].axhline(slo["attainment"] * 100, color="red", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DECISION = re.compile(r"^\d\d:\d\d:\d\d (hold|move|paused) ")


def steady(seconds: float, mix: tuple[float, float, float], out: Path) -> int:
    """The autoscaler on a steady workload from the model's best split for it: every decision
    it made, and how many were moves (issue 27: no flapping over 10 minutes)."""
    rate, prompt, output = mix
    phases: tuple[Phase, ...] = (("S", rate, int(prompt), int(output)),)
    topology, _ = deploy(Path(tempfile.mkdtemp(prefix="pdkit-bench-autoscale-")))
    split, rated = best_splits(topology, phases)["S"]
    print(f"steady {rate:g} req/s, {prompt:g} in / {output:g} out: {split.describe()}; {rated}")
    up = pdkit("up", str(topology), "--no-gate")
    if up.returncode != 0:
        print(up.stdout[-3000:], up.stderr[-3000:])
        pdkit("down", str(topology), timeout=300)
        return 1
    run = Run(f"autoscale steady from {split.describe()}", split, True)
    try:
        ctx = DeployContext.build(resolve(topology), topology)
        serve(topology, ctx, run, seconds, out, phases=phases)
    finally:
        pdkit("down", str(topology), timeout=300)
    lines = (out / f"{run.name}-autoscale.log").read_text().splitlines()
    actions = [m.group(1) for m in map(DECISION.match, lines) if m]
    p = run.phases["S"]
    print(
        f"{seconds:.0f} s of steady load: {len(actions)} decisions, "
        + ", ".join(f"{actions.count(a)} {a}" for a in ("hold", "move", "paused"))
        + f"; {p['ok']}/{p['requests']} ok, attainment {p['attainment']:.1%}, "
        f"goodput {p['goodput_rps']:.2f} req/s"
    )
    splits_seen = sorted({(pf, d) for _, pf, d in run.timeline})
    print("splits seen: " + ", ".join(f"{pf}P{d}D" for pf, d in splits_seen))
    for move in run.moves:
        print(f"  {move}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase", type=float, default=45.0, help="seconds per phase")
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "autoscale")
    parser.add_argument(
        "--splits",
        choices=("all", "best"),
        default="all",
        help="static splits to serve: every split of the pool (default) or each phase's best",
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="instead: serve one steady workload (--steady-mix) this long with the autoscaler "
        "on, from the model's best split for it, and count its moves (none is right)",
    )
    parser.add_argument(
        "--steady-mix",
        type=float,
        nargs=3,
        default=(3.0, 1000, 64),
        metavar=("RATE", "IN", "OUT"),
        help="the steady workload: requests/s, input and output tokens",
    )
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    if options.steady:
        return steady(options.steady, options.steady_mix, options.out)
    folder = Path(tempfile.mkdtemp(prefix="pdkit-bench-autoscale-"))
    topology, data = deploy(folder)
    best = best_splits(topology)
    for name, (split, rated) in best.items():
        print(f"phase {name}: model's best static split {split.describe()}; predicted {rated}")
    began = time.monotonic()
    up = pdkit("up", str(topology), "--no-gate")
    if up.returncode != 0:
        print(up.stdout[-3000:], up.stderr[-3000:])
        pdkit("down", str(topology), timeout=300)
        return 1
    print(f"pdkit up: {time.monotonic() - began:.0f} s")
    auto = Run(f"autoscale from {best['A'][0].describe()}", best["A"][0], True)
    runs = [*static_runs(best, options.splits), auto]
    try:
        ctx = DeployContext.build(resolve(topology), topology)
        for run in runs:
            print(f"run: {run.name}")
            serve(topology, ctx, run, options.phase, options.out)
    finally:
        pdkit("down", str(topology), timeout=300)
    slo = data["slo"]
    print()
    print(f"{'run':34} {'phase':5} {'ok/sent':>9} {'attain':>7} {'goodput/s':>9}")
    totals = {}
    for run in runs:
        good = sum(p["good"] for p in run.phases.values())
        seconds = sum(p["seconds"] for p in run.phases.values())
        failed = sum(p["requests"] - p["ok"] for p in run.phases.values())
        totals[run.name] = good / seconds if seconds else 0.0
        for name, p in run.phases.items():
            print(
                f"{run.name:34} {name:5} {p['ok']:>4}/{p['requests']:<4} "
                f"{p['attainment']:>6.1%} {p['goodput_rps']:>9.2f}"
            )
        print(f"{run.name:34} {'all':5} {'':9} {'':7} {totals[run.name]:>9.2f}  failed {failed}")
    for run in runs[:-1]:
        ratio = totals[auto.name] / totals[run.name] if totals[run.name] else float("inf")
        print(f"autoscale / {run.name}: {ratio:.2f}x goodput")
    best_static = max(runs[:-1], key=lambda r: totals[r.name])
    verdict = "beats" if totals[auto.name] > totals[best_static.name] else "does not beat"
    print(
        f"autoscale {verdict} every static split run: {totals[auto.name]:.2f} req/s against "
        f"the best, {best_static.name}, {totals[best_static.name]:.2f} req/s"
        + (" (only the two ends were run: --splits best)" if options.splits == "best" else "")
    )
    print("autoscale moves:")
    for move in auto.moves:
        print(f"  {move}")
    plot(runs, slo, options.out / "autoscale_timeline.png")
    (options.out / "autoscale.json").write_text(
        json.dumps(
            {
                "phases": PHASES,
                "phase_s": options.phase,
                "speed": SPEED,
                "slo": slo,
                "best": {k: (v[0].describe(), v[1]) for k, v in best.items()},
                "runs": [
                    {
                        "name": r.name,
                        "phases": r.phases,
                        "goodput_rps": totals[r.name],
                        "timeline": r.timeline,
                        "moves": r.moves,
                    }
                    for r in runs
                ],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"timeline: {options.out / 'autoscale_timeline.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
