"""`make bench-goodput`: does the goodput `pdkit bench --search` measures on a live sim
deployment agree with what kit/perf's virtual-time model predicts for the same topology and
workload?

This machine (2 cores) cannot hold the local default's real goodput (about 170 requests/s for
2P1D Llama-3.1-8B on H100s at 512 in / 64 out): the client, the router and the emulated
workers would compete for the cores and the measurement would be of the machine. So the
emulated GPUs are slowed with PDKIT_SIM_SPEED and the SLO stretched by the same factor, which
keeps the model's answer (every duration scales, so goodput scales by the speed) while the
deployment's work per second drops to what the machine holds easily. The run deploys a copy of
topologies/local.yaml with its own name, ports and state (`pdkit up`), searches, prints the
measured and predicted goodput and their ratio, and takes the deployment down.

    python -m benchmarks.bench_goodput [--speed 0.05] [--requests 200] [--out .bench/goodput]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from tests.support.local_deploy import API_KEY, API_KEY_ENV, write_topology

REPO = Path(__file__).resolve().parent.parent


def pdkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, API_KEY_ENV: API_KEY}
    return subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", *args],
        cwd=REPO,
        env=env,
        text=True,
        capture_output=False,
        check=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=0.05)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--start", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "goodput")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="pdkit-goodput-"))
    topology, data = write_topology(folder, "goodput")
    data["defaults"]["env"] = {"PDKIT_SIM_SPEED": f"{args.speed:g}"}
    stretch = 1 / args.speed
    data["slo"] = {"ttft_ms": 400 * stretch, "tpot_ms": 40 * stretch, "attainment": 0.9}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    print(
        f"make bench-goodput: 2P1D sim at PDKIT_SIM_SPEED {args.speed:g}, SLO TTFT <= "
        f"{400 * stretch:g} ms and TPOT <= {40 * stretch:g} ms (400/40 ms at full speed), "
        f"{args.requests} requests per point",
        flush=True,
    )
    up = pdkit("up", str(topology))
    try:
        if up.returncode != 0:
            return up.returncode
        run = pdkit(
            "bench",
            str(topology),
            "--search",
            "--start",
            f"{args.start:g}",
            "--requests",
            str(args.requests),
            "--out",
            str(args.out),
        )
        if run.returncode != 0:
            return run.returncode
    finally:
        pdkit("down", str(topology))
    summary = json.loads((args.out / "summary.json").read_text())
    measured = summary["search"]["goodput"]
    predicted = summary["prediction"]["goodput"]
    print(
        f"goodput measured {measured:g} req/s, predicted {predicted:.2f} req/s: measured / "
        f"predicted = {measured / predicted:.2f} (agreement target: within 0.85-1.15)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
