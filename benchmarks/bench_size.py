"""`make bench-size`: how fast `pdkit size` answers, and whether its answer holds when deployed.

Part 1 (this process): DistServe's question (Llama-2-13B on A100-80G, 512 in / 64 out, Poisson,
TTFT 400 ms and TPOT 40 ms for 90%) sized for 8, 16 and 64 GPUs: search time and the answer. The
baseline, measured in the same run: the exhaustive search on 8 GPUs (every candidate served),
against which the pruned search's time and best goodput are given as ratios.

Part 2 (under the e2e lock, /tmp/pdkit-e2e.lock): the loop. A copy of topologies/local.yaml
made into DistServe's 3 A100-80Gs (engine sim, Mooncake over TCP), the emulated GPUs slowed by
PDKIT_SIM_SPEED and the SLO stretched alike so that this 2-core machine holds the deployment's
goodput (as make bench-goodput does). `pdkit size` on it emits the topology; `pdkit up`, `pdkit
bench --search` measures it, `pdkit down`. Error 1: measured against `pdkit size`'s predicted
goodput. Then `pdkit size --calibrate` on that run fits the efficiency factors (into a store in
the run folder, not the user's), and error 2 is measured against the calibrated prediction.

    python -m benchmarks.bench_size [--speed 0.4] [--requests 200] [--skip-deploy] \
        [--out .bench/size]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from benchmarks.bench_goodput import pdkit
from kit.sizing.calibration import CALIBRATION_ENV
from kit.sizing.search import SizingResult, size
from tests.support.local_deploy import write_topology
from tests.support.sizing_cases import DISTSERVE_GPU, DISTSERVE_MODEL, DISTSERVE_SLO, distserve

REPO = Path(__file__).resolve().parent.parent
E2E_LOCK = Path("/tmp/pdkit-e2e.lock")


def timed(gpus: int, *, exhaustive: bool = False) -> tuple[SizingResult, float]:
    started = time.perf_counter()
    result = size(distserve(gpus), exhaustive=exhaustive)
    return result, time.perf_counter() - started


def search_times() -> None:
    print(
        "Part 1: search time, DistServe's question (Llama-2-13B on A100-80G, 512 in / 64 out, "
        "TTFT 400 ms, TPOT 40 ms, 90%)",
        flush=True,
    )
    everything, baseline = timed(8, exhaustive=True)
    print(
        f"  baseline: exhaustive search on 8 GPUs, {everything.verified} PD units served: "
        f"{baseline:.1f} s, best {_best(everything)}",
        flush=True,
    )
    for gpus in (8, 16, 64):
        result, seconds = timed(gpus)
        line = (
            f"  {gpus:>2} GPUs: {seconds:5.1f} s ({result.points} points, {result.verified} PD "
            f"units served), best {_best(result)}"
        )
        if gpus == 8 and result.best and everything.best:
            line += (
                f"; vs exhaustive: {seconds / baseline:.2f}x the time, "
                f"{result.best.goodput / everything.best.goodput:.3f}x the goodput"
            )
        print(line, flush=True)


def _best(result: SizingResult) -> str:
    best, colocated = result.best, result.best_colocated
    if best is None:
        return "none"
    text = f"{best.deployment.label()} {best.goodput:.1f} req/s on {best.gpus} GPUs"
    if colocated is not None and best is not colocated:
        text += f" ({best.per_gpu / colocated.per_gpu:.2f}x colocated per GPU)"
    return text


@contextmanager
def e2e_lock() -> Iterator[None]:
    with E2E_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def base_topology(folder: Path, speed: float) -> Path:
    """local.yaml with its own name and ports, as DistServe's 3 A100-80Gs, slowed by `speed`."""
    path, data = write_topology(folder, "size")
    stretch = 1 / speed
    data["model"] = {"path": DISTSERVE_MODEL, "served_name": "llama-2-13b"}
    data["hosts"][0]["gpu_type"] = DISTSERVE_GPU
    data["defaults"]["env"] = {"PDKIT_SIM_SPEED": f"{speed:g}"}
    data["slo"] = {
        "ttft_ms": DISTSERVE_SLO.ttft_ms * stretch,
        "tpot_ms": DISTSERVE_SLO.tpot_ms * stretch,
        "attainment": DISTSERVE_SLO.attainment,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def loop(speed: float, requests: int, out: Path) -> int:
    folder = out / "deploy"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ[CALIBRATION_ENV] = str(folder / "calibration.json")
    emitted = folder / "sized.yaml"
    run = folder / "run"
    print(
        f"\nPart 2: the loop on 3 emulated A100-80Gs at PDKIT_SIM_SPEED {speed:g} (SLO "
        f"stretched {1 / speed:g}x), {requests} requests per point",
        flush=True,
    )
    # Ports are picked once the lock is held: another deployment may take them while we wait.
    with e2e_lock():
        base = base_topology(folder, speed)
        sized = pdkit("size", str(base), "--emit", str(emitted), "--out", str(folder / "size"))
        if sized.returncode != 0:
            return sized.returncode
        chosen = json.loads((folder / "size" / "size.json").read_text())["best_pd"]
        predicted = chosen["goodput"]
        up = pdkit("up", str(emitted))
        try:
            if up.returncode != 0:
                return up.returncode
            bench = pdkit(
                "bench",
                str(emitted),
                "--search",
                "--start",
                f"{predicted * 0.8:.3g}",
                "--tolerance",
                "0.05",
                "--requests",
                str(requests),
                "--out",
                str(run),
            )
            if bench.returncode != 0:
                return bench.returncode
        finally:
            pdkit("down", str(emitted))
    calibrated = pdkit("size", str(emitted), "--calibrate", str(run))
    if calibrated.returncode != 0:
        return calibrated.returncode
    measured = json.loads((run / "summary.json").read_text())["search"]["goodput"]
    fit = json.loads((run / "calibration.json").read_text())["goodput"]
    before, after = fit["before"], fit["after"]
    print(
        f"\nemitted {chosen['label']}: goodput measured {measured:g} req/s; predicted by pdkit "
        f"size {predicted:.2f} req/s: error {measured / predicted - 1:+.1%} (target: within "
        f"15%). On the run's own requests: predicted {before:.2f} req/s before --calibrate "
        f"(error {measured / before - 1:+.1%}), {after:.2f} after (error "
        f"{measured / after - 1:+.1%})"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=0.4)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--skip-deploy", action="store_true", help="Part 1 only.")
    parser.add_argument("--skip-times", action="store_true", help="Part 2 only.")
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "size")
    args = parser.parse_args(argv)
    if not args.skip_times:
        search_times()
    if args.skip_deploy:
        return 0
    return loop(args.speed, args.requests, args.out)


if __name__ == "__main__":
    sys.exit(main())
