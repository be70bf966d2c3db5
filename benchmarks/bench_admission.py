"""`make bench-admission`: does pdkit's SLO-aware admission keep a PD deployment's goodput past
its goodput rate, where without it the queues grow and attainment collapses?

A sim deployment as in `make bench-goodput` (a copy of topologies/local.yaml, 2P1D, the
emulated GPUs slowed with PDKIT_SIM_SPEED and the SLO stretched by the same factor, so that
this 2-core machine holds the load), then:

1. its goodput G, measured once with `pdkit bench --search` (admission off);
2. `pdkit bench --rates` at 1x, 1.5x and 2x G, admission off;
3. the same with `router.admission.enabled: true` (`pdkit up` again restarts only the
   router);

and a table of each point: the requests sent, those refused with 429, goodput (requests/s that
met the SLO), attainment over every request sent (429s count as misses) and over the admitted
ones only, and the admitted requests' TTFT p90. Target: with admission, goodput at 2x is at
least 90% of the goodput at 1x without it.

    python -m benchmarks.bench_admission [--speed 0.05] [--requests 300] [--out .bench/admission]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_goodput import pdkit
from tests.support.local_deploy import write_topology

REPO = Path(__file__).resolve().parent.parent
MULTIPLES = (1.0, 1.5, 2.0)
TARGET = 0.9  # goodput with admission at 2x, against the goodput at 1x without it


def sim_topology(folder: Path, speed: float, admission: bool) -> tuple[Path, dict[str, Any]]:
    """The bench's topology: local.yaml at `speed`, its SLO stretched by 1 / speed."""
    topology, data = write_topology(folder, "admission")
    data["defaults"]["env"] = {"PDKIT_SIM_SPEED": f"{speed:g}"}
    stretch = 1 / speed
    data["slo"] = {"ttft_ms": 400 * stretch, "tpot_ms": 40 * stretch, "attainment": 0.9}
    data["router"]["admission"] = {"enabled": admission}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    return topology, data


def set_admission(topology: Path, data: dict[str, Any], enabled: bool) -> None:
    data["router"]["admission"] = {"enabled": enabled}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))


def bench(topology: Path, out: Path, *options: str) -> dict[str, Any]:
    run = pdkit("bench", str(topology), "--out", str(out), "--no-predict", *options)
    if run.returncode != 0:
        raise SystemExit(f"pdkit bench failed ({run.returncode}); see above")
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def row(label: str, multiple: float, point: dict[str, Any]) -> str:
    ttft = point["ttft_ms"]["p90"]
    return (
        f"  {multiple:4.1f}x {point['rate']:6.2f}  {label:9} {point['requests']:5d} "
        f"{point.get('rejected', 0):5d}  {point['goodput_rps']:7.2f}  "
        f"{point['attainment']:9.1%}  {point.get('admitted_attainment', 0.0):9.1%}  "
        f"{'-' if ttft is None else f'{ttft / 1000:.1f} s':>9}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--speed", type=float, default=0.05)
    parser.add_argument("--requests", type=int, default=300, help="requests per rate point")
    parser.add_argument("--search-requests", type=int, default=200)
    parser.add_argument("--start", type=float, default=4.0, help="first rate of the search")
    parser.add_argument("--goodput", type=float, help="skip the search: use this rate as 1x")
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "admission")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="pdkit-admission-"))
    topology, data = sim_topology(folder, args.speed, admission=False)
    ttft_s, tpot_s = data["slo"]["ttft_ms"] / 1000, data["slo"]["tpot_ms"] / 1000
    print(
        f"make bench-admission: 2P1D sim at PDKIT_SIM_SPEED {args.speed:g}, SLO TTFT <= "
        f"{ttft_s:g} s and TPOT <= {tpot_s:g} s (400/40 ms at full speed), 90% attainment",
        flush=True,
    )
    up = pdkit("up", str(topology))
    points: dict[bool, list[dict[str, Any]]] = {}
    try:
        if up.returncode != 0:
            return up.returncode
        goodput = args.goodput
        if goodput is None:
            found = bench(
                topology,
                args.out / "search",
                "--search",
                "--start",
                f"{args.start:g}",
                "--requests",
                str(args.search_requests),
            )
            goodput = float(found["search"]["goodput"])
            if goodput <= 0:
                raise SystemExit("the search found no rate that meets the SLO")
        rates = ",".join(f"{goodput * m:.3g}" for m in MULTIPLES)
        for admission in (False, True):
            if admission:
                set_admission(topology, data, True)
                if pdkit("up", str(topology)).returncode != 0:
                    return 1
            summary = bench(
                topology,
                args.out / ("on" if admission else "off"),
                "--rates",
                rates,
                "--requests",
                str(args.requests),
                "--timeout",
                f"{max(120.0, 20 * ttft_s):g}",
            )
            points[admission] = summary["points"]
    finally:
        pdkit("down", str(topology))
    report(goodput, points)
    return 0


def report(goodput: float, points: dict[bool, list[dict[str, Any]]]) -> None:
    print()
    print(f"goodput G = {goodput:g} req/s (pdkit bench --search, admission off)")
    print(
        "attainment: over every request sent (a 429 is a miss) | admitted: over the requests "
        "not refused with 429\ngoodput: requests/s that met the SLO (a 429 never does)"
    )
    print(
        f"  {'load':>5} {'req/s':>6}  {'admission':9} {'sent':>5} {'429':>5}  {'goodput':>7}  "
        f"{'attainment':>9}  {'admitted':>9}  {'TTFT p90':>9}"
    )
    for admission in (False, True):
        for multiple, point in zip(MULTIPLES, points[admission], strict=True):
            print(row("on" if admission else "off", multiple, point))
    base = points[False][0]["goodput_rps"]
    with_admission = points[True][-1]["goodput_rps"]
    without = points[False][-1]["goodput_rps"]
    ratio = with_admission / base if base else 0.0
    verdict = "met" if ratio >= TARGET else "missed"
    print(
        f"\nat 2x: goodput {with_admission:.2f} req/s with admission, {without:.2f} without; "
        f"with admission / 1x without = {ratio:.2f} (target >= {TARGET:g}: {verdict})"
    )


if __name__ == "__main__":
    sys.exit(main())
