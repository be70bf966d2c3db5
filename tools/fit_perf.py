#!/usr/bin/env python3
"""Fit `kit.perf.timing`'s roofline constants to a GPU's measured step times.

    python -m tools.fit_perf benchmarks/data/h200-calibration.json [--gpu H200] [--json OUT]

Reads what `tools/gpu_calibrate.py` measured on one GPU (prefill and CUDA-graph decode step
times of random-weights models) and fits the model

    step = max(FLOPs / (peak x compute), bytes / (bandwidth x memory)) + step + layer x layers

with `kit.perf.timing.TimingModel` supplying each point's FLOPs and bytes (at efficiency 1):

1. the decode steps, memory-bound, give memory efficiency, step and layer overhead by linear
   least squares on relative error (t = bytes/(bw x memory) + step + layer x layers; the shapes'
   different layer counts separate the two overheads);
2. the prefills of at least `--min-prefill` tokens (shorter ones are bound by the host
   launching eager kernels, which the roofline does not model) give compute efficiency, the
   overheads of step 1 taken off, by least squares on relative error;
3. points are re-assigned to the term the fitted model says bounds them, and 1-2 repeat.

A second fit keeps the sourced overheads and fits only the two efficiencies. It prints each
point's measured time and the relative error of the current constants and of both fits.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kit.perf import timing
from kit.perf.gpus import gpu_spec
from kit.perf.models import ModelShape
from kit.perf.timing import Efficiency, StepShape, TimingModel
from kit.topology.launch import Parallelism

ROUNDS = 5
KV_FRACTION = 0.05
"""A decode whose KV is over this fraction of its bytes is fitted only if its attention grid
covers half the SMs or more."""


@dataclass(frozen=True)
class Point:
    """One measured step: its kind, shape, layers, raw roofline terms (seconds at efficiency 1)
    and measured seconds."""

    kind: str  # "prefill" or "decode"
    shape: str
    label: str
    layers: int
    compute_s: float
    memory_s: float
    measured_s: float
    kv_fraction: float = 0.0  # of the bytes moved, the KV read and written
    attention_ctas: int = 0  # a decode's batch x KV heads: torch's decode attention grid


@dataclass(frozen=True)
class Constants:
    compute: float
    memory: float
    step_overhead_s: float
    layer_overhead_s: float

    def predict(self, p: Point) -> float:
        roof = max(p.compute_s / self.compute, p.memory_s / self.memory)
        return roof + self.step_overhead_s + self.layer_overhead_s * p.layers


CURRENT = Constants(
    timing.COMPUTE_EFFICIENCY,
    timing.MEMORY_EFFICIENCY,
    timing.STEP_OVERHEAD_S,
    timing.LAYER_OVERHEAD_S,
)


def shape_of(entry: dict[str, Any]) -> ModelShape:
    s = entry["shape"]
    return ModelShape(
        name=s["name"],
        hidden=s["hidden"],
        layers=s["layers"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        intermediate=s["intermediate"],
        vocab=s["vocab"],
        context_len=131072,
        tie_embeddings=s["tie_embeddings"],
    )


def points_of(data: dict[str, Any], gpu: str) -> list[Point]:
    """Every timed prefill and graph-replayed decode step, with its roofline terms."""
    out = []
    for entry in data["shapes"]:
        shape = shape_of(entry)
        model = TimingModel(shape, gpu_spec(gpu), Parallelism(), efficiency=Efficiency(1.0, 1.0))
        steps: list[tuple[str, str, StepShape, float]] = []
        for p in entry.get("prefill", []):
            if "seconds" in p:
                step = StepShape(prefill=((p["new"], p["cached"]),), sampled=1)
                steps.append(("prefill", f"{p['new']}+{p['cached']}", step, p["seconds"]))
        for d in entry.get("decode", []):
            if "seconds" in d and d.get("graph"):
                b, c = d["batch"], d["context"]
                step = StepShape(decode_reqs=b, decode_context=b * c, sampled=b)
                steps.append(("decode", f"B{b} C{c}", step, d["seconds"]))
        for kind, label, step, seconds in steps:
            compute_s, memory_s = model.roofline_seconds(step)
            _, weights_s = model.roofline_seconds(StepShape(decode_reqs=1))
            ctas = step.decode_reqs * shape.kv_heads
            kv = 1 - weights_s / memory_s if kind == "decode" else 0.0
            out.append(
                Point(kind, shape.name, label, shape.layers, compute_s, memory_s, seconds, kv, ctas)
            )
    return out


def solve(rows: list[list[float]], rhs: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, rhs, strict=True)) for i in range(n)]
    for col in range(n):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for k in range(col + 1, n):
            f = a[k][col] / a[col][col]
            a[k] = [x - f * y for x, y in zip(a[k], a[col], strict=True)]
            b[k] -= f * b[col]
    x = [0.0] * n
    for col in reversed(range(n)):
        x[col] = (b[col] - sum(a[col][k] * x[k] for k in range(col + 1, n))) / a[col][col]
    return x


def left_out(p: Point, min_prefill: int, sms: int) -> str:
    """Why a point is not fitted ("" when it is): a short prefill is bound by the host launching
    eager kernels; a decode whose KV is a noticeable part of its bytes but whose attention grid
    (one block per request and KV head: torch's flash decode has no split-KV) leaves SMs idle
    reads the KV far under bandwidth, which SGLang's split-KV decode kernels do not. Measured on
    an H200: 8 requests of 8 KV heads (64 blocks, 132 SMs) at 32k context took 18.3 ms, as long as
    1 request (18.0 ms), 16 requests 21.5 ms."""
    if p.kind == "prefill" and _prefill_tokens(p) < min_prefill:
        return "host-bound"
    if p.kind == "decode" and 2 * p.attention_ctas < sms and p.kv_fraction > KV_FRACTION:
        return "grid < SMs/2"
    return ""


def fit(
    points: list[Point], min_prefill: int, sms: int, fixed: Constants | None = None
) -> Constants:
    """The constants that minimise the squared relative error (see the module docstring);
    with `fixed`, its overheads are kept and only the efficiencies are fitted."""
    c = fixed or CURRENT
    usable = [p for p in points if not left_out(p, min_prefill, sms)]
    for _ in range(ROUNDS):
        memory_bound = [p for p in usable if p.memory_s / c.memory >= p.compute_s / c.compute]
        compute_bound = [p for p in usable if p not in memory_bound]
        step, layer = c.step_overhead_s, c.layer_overhead_s
        if fixed is None:
            rows = [
                [p.memory_s / p.measured_s, 1 / p.measured_s, p.layers / p.measured_s]
                for p in memory_bound
            ]
            inv_memory, step, layer = solve(rows, [1.0] * len(rows))
        else:
            rows = [[p.memory_s / p.measured_s] for p in memory_bound]
            rhs = [1 - (step + layer * p.layers) / p.measured_s for p in memory_bound]
            (inv_memory,) = solve(rows, rhs)
        rows = [[p.compute_s / p.measured_s] for p in compute_bound]
        rhs = [1 - (step + layer * p.layers) / p.measured_s for p in compute_bound]
        (inv_compute,) = solve(rows, rhs)
        c = Constants(1 / inv_compute, 1 / inv_memory, step, layer)
    return c


def _prefill_tokens(p: Point) -> int:
    return int(p.label.split("+")[0]) if p.kind == "prefill" else 0


def error(c: Constants, p: Point) -> float:
    """Relative error of the prediction: predicted / measured - 1."""
    return c.predict(p) / p.measured_s - 1


def rms(c: Constants, points: list[Point]) -> float:
    return math.sqrt(sum(error(c, p) ** 2 for p in points) / len(points))


def report(points: list[Point], fits: dict[str, Constants], min_prefill: int, sms: int) -> str:
    names = list(fits)
    lines = [
        f"{'constant':<22}" + "".join(f"{n:>16}" for n in names),
        f"{'compute efficiency':<22}" + "".join(f"{fits[n].compute:>16.3f}" for n in names),
        f"{'memory efficiency':<22}" + "".join(f"{fits[n].memory:>16.3f}" for n in names),
        f"{'step overhead (us)':<22}"
        + "".join(f"{fits[n].step_overhead_s * 1e6:>16.1f}" for n in names),
        f"{'layer overhead (us)':<22}"
        + "".join(f"{fits[n].layer_overhead_s * 1e6:>16.2f}" for n in names),
        "",
        f"{'shape':<22}{'point':<14}{'measured ms':>12}"
        + "".join(f"{'err ' + n:>16}" for n in names),
    ]
    for p in points:
        why = left_out(p, min_prefill, sms)
        flag = f"  (not fitted: {why})" if why else ""
        lines.append(
            f"{p.shape:<22}{p.kind[0] + ' ' + p.label:<14}{p.measured_s * 1e3:>12.3f}"
            + "".join(f"{error(fits[n], p):>+16.1%}" for n in names)
            + flag
        )
    fitted = [p for p in points if not left_out(p, min_prefill, sms)]
    for kind in ("prefill", "decode"):
        subset = [p for p in fitted if p.kind == kind]
        label = f"rms error, {len(subset)} {kind}s fitted"
        lines.append(f"{label:<48}" + "".join(f"{rms(fits[n], subset):>16.1%}" for n in names))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("timings", type=Path, help="JSON written by tools/gpu_calibrate.py")
    ap.add_argument("--gpu", default="H200", help="GPU spec the peaks come from")
    ap.add_argument("--min-prefill", type=int, default=2048, help="shortest prefill fitted")
    ap.add_argument("--json", type=Path, help="write the fitted constants here")
    args = ap.parse_args(argv)
    data = json.loads(args.timings.read_text())
    points = points_of(data, args.gpu)
    sms = int(data.get("sms", 0))
    spec = gpu_spec(args.gpu)
    default = Efficiency.for_gpu(spec)
    fits = {
        "sourced": CURRENT,
        f"{spec.name} now": Constants(
            default.compute, default.memory, CURRENT.step_overhead_s, CURRENT.layer_overhead_s
        ),
        "fit": fit(points, args.min_prefill, sms),
        "fit (eff. only)": fit(points, args.min_prefill, sms, fixed=CURRENT),
    }
    print(
        f"{data.get('device')} ({data.get('started')}, torch {data.get('torch')}); peaks from "
        f"{spec.name}: {spec.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{spec.hbm_bandwidth / 1e12:.2f} TB/s"
    )
    if "ceilings" in data:
        ceil = data["ceilings"]
        print(
            f"measured ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s "
            f"({ceil['copy_bytes_per_s'] / spec.hbm_bandwidth:.0%} of peak), matmul "
            f"{ceil['matmul_bf16_flops'] / 1e12:.0f} TFLOP/s "
            f"({ceil['matmul_bf16_flops'] / spec.bf16_flops:.0%} of peak)"
        )
    print(report(points, fits, args.min_prefill, sms))
    if args.json:
        args.json.write_text(json.dumps({k: asdict(v) for k, v in fits.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
