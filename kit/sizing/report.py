"""What `pdkit size` prints: the question, the ranked table with the colocated baseline, PD
against colocated, the robustness rows, the calibration before and after; and the same as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from kit.sizing.calibration import Calibration, Fit, Latencies
from kit.sizing.candidates import Deployment, Group
from kit.sizing.capacity import GroupRate
from kit.sizing.problem import SizingProblem
from kit.sizing.robustness import Variant
from kit.sizing.search import Rated, SizingResult


def _table(title: str) -> Table:
    """A table in the style of `pdkit bench`'s, one space between columns to fit 80."""
    return Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def question(problem: SizingProblem, efficiency_note: str) -> list[str]:
    """The problem as the lines that open the output."""
    hosts = problem.base["hosts"]
    slo = problem.slo
    where = f"{problem.gpus} GPUs ({len(hosts)} host(s) of up to {problem.gpus_per_host})" + (
        ", generic hosts" if problem.generic_hosts else ""
    )
    lines = [
        f"pdkit size: {problem.model.name} on {problem.gpu.name}, {where}; SLO TTFT <= "
        f"{slo.ttft_ms:g} ms, TPOT <= {slo.tpot_ms:g} ms, {slo.attainment:.0%} attainment",
        f"  workload: {problem.workload.describe()}",
        f"  efficiency: {efficiency_note}",
    ]
    if problem.speed != 1:
        lines.append(
            f"  sim slowed by PDKIT_SIM_SPEED {problem.speed:g}: rates and latencies are the "
            "slowed deployment's"
        )
    if problem.target_rate is not None:
        lines.append(f"  target: the fewest GPUs that serve {problem.target_rate:g} req/s")
    return lines


def search_line(result: SizingResult) -> str:
    return (
        f"searched {result.enumerated} deployments: {result.verified} PD unit(s) and "
        f"{len(result.capacities.colocated)} colocated option(s) served in virtual time "
        f"({result.points} points), {result.refused} refused by the validator, in "
        f"{result.seconds:.1f} s"
    )


def ranked_table(result: SizingResult, top: int) -> Table:
    """The best `top` deployments, and the best colocated one if it is not among them."""
    shown = result.ranked[:top]
    colocated = result.best_colocated
    if colocated is not None and colocated not in shown:
        shown.append(colocated)
    table = _table("Deployments, best first (goodput in req/s; latencies at that rate, ms)")
    for name in ("#", "deployment", "GPUs", "good/s", "/GPU", "TTFT p90", "TPOT p90", "bound"):
        left = name in ("deployment", "bound")
        table.add_column(name, justify="left" if left else "right", no_wrap=not left)
    for r in shown:
        table.add_row(
            str(result.ranked.index(r) + 1),
            r.deployment.label(),
            str(r.gpus),
            f"{r.goodput:.2f}",
            f"{r.per_gpu:.2f}",
            _ms(r.latency_ms("p90_ttft_ms")),
            _ms(r.latency_ms("p90_tpot_ms")),
            r.bottleneck,
        )
    return table


def comparison(result: SizingResult) -> str | None:
    """PD's best against colocated's best, in goodput and per GPU."""
    pd, colocated = result.best_pd, result.best_colocated
    if pd is None or colocated is None or colocated.goodput <= 0:
        return None
    target = result.problem.target_rate
    if target is not None and result.reaches_target:
        return (
            f"PD against colocated for {target:g} req/s: {pd.deployment.label()} on {pd.gpus} "
            f"GPUs, {colocated.deployment.label()} on {colocated.gpus} GPUs: colocated needs "
            f"{colocated.gpus / pd.gpus:.2f}x the GPUs"
        )
    return (
        f"PD against colocated: {pd.deployment.label()} serves {pd.goodput:.2f} req/s on "
        f"{pd.gpus} GPUs ({pd.per_gpu:.2f} per GPU), {colocated.deployment.label()} "
        f"{colocated.goodput:.2f} req/s on {colocated.gpus} GPUs ({colocated.per_gpu:.2f} per "
        f"GPU): {pd.goodput / colocated.goodput:.2f}x the goodput, "
        f"{pd.per_gpu / colocated.per_gpu:.2f}x per GPU"
    )


def target_line(result: SizingResult) -> str | None:
    target = result.problem.target_rate
    best = result.best
    if target is None or best is None:
        return None
    if not result.reaches_target:
        return (
            f"no deployment on these {result.problem.gpus} GPUs serves {target:g} req/s; the "
            f"best serves {best.goodput:.2f} req/s. To fix: add hosts (--gpus), relax the SLO "
            "or lower the target."
        )
    return (
        f"fewest GPUs for {target:g} req/s: {best.gpus}, as {best.deployment.label()} "
        f"({best.goodput:.2f} req/s)"
    )


def robustness_lines(rated: Rated, variants: Sequence[Variant]) -> list[str]:
    lines = [f"Robustness of {rated.deployment.label()} ({rated.goodput:.2f} req/s planned):"]
    for v in variants:
        lines.append(f"  {v.describe():12} {v.goodput:8.2f} req/s  ({v.change:+.0%})")
    return lines


def _group_json(group: Group | None) -> dict[str, Any] | None:
    if group is None:
        return None
    o = group.option
    return {
        "count": group.count,
        "tp": o.tp,
        "dp": o.dp,
        "dp_attention": o.dp_attention,
        "ep": o.ep,
        "chunked_prefill_size": o.chunked_prefill_size,
        "max_running_requests": o.max_running_requests,
    }


def _deployment_json(d: Deployment) -> dict[str, Any]:
    return {
        "kind": d.kind,
        "label": d.label(),
        "gpus": d.gpus,
        "prefill": _group_json(d.prefill),
        "decode": _group_json(d.decode),
        "colocated": _group_json(d.colocated),
    }


def rated_json(r: Rated) -> dict[str, Any]:
    return {
        **_deployment_json(r.deployment),
        "unit": r.unit.label(),
        "copies": r.copies,
        "goodput": round(r.goodput, 4),
        "goodput_per_gpu": round(r.per_gpu, 4),
        "estimate": round(r.estimate, 4),
        "p90_ttft_ms": r.latency_ms("p90_ttft_ms"),
        "p90_tpot_ms": r.latency_ms("p90_tpot_ms"),
        "p50_tpot_ms": r.latency_ms("p50_tpot_ms"),
        "bottleneck": r.bottleneck,
    }


def result_json(
    result: SizingResult,
    efficiency: dict[str, Any],
    variants: Sequence[Variant],
    files: dict[str, str],
) -> dict[str, Any]:
    p = result.problem
    return {
        "model": p.model.name,
        "gpu": p.gpu.name,
        "gpus": p.gpus,
        "slo": p.slo.model_dump(),
        "workload": p.workload.describe(),
        "target_rate": p.target_rate,
        "reaches_target": result.reaches_target,
        "speed": p.speed,
        "efficiency": efficiency,
        "ranked": [rated_json(r) for r in result.ranked],
        "best": result.best and rated_json(result.best),
        "best_pd": result.best_pd and rated_json(result.best_pd),
        "best_colocated": result.best_colocated and rated_json(result.best_colocated),
        "robustness": [
            {
                "length": v.length,
                "factor": v.factor,
                "goodput": round(v.goodput, 4),
                "change": round(v.change, 4),
            }
            for v in variants
        ],
        "search": {
            "enumerated": result.enumerated,
            "verified": result.verified,
            "refused": result.refused,
            "points": result.points,
            "seconds": round(result.seconds, 3),
        },
        "files": files,
    }


def emitted_header(
    result: SizingResult, chosen: Rated, variants: Sequence[Variant], efficiency_note: str
) -> list[str]:
    """The comment block on top of an emitted topology."""
    p = result.problem
    slo = p.slo
    speed = f", sim at PDKIT_SIM_SPEED {p.speed:g}" if p.speed != 1 else ""
    lines = [
        f"Sized by `pdkit size` (kit/perf's model in virtual time{speed}) for {p.model.name} "
        f"on {p.gpu.name}: TTFT <= {slo.ttft_ms:g} ms and TPOT <= {slo.tpot_ms:g} ms for "
        f"{slo.attainment:.0%} of requests; workload {p.workload.describe()}; efficiency "
        f"{efficiency_note}.",
        f"Chosen: {chosen.deployment.label()} on {chosen.gpus} of {p.gpus} GPUs: predicted "
        f"goodput {chosen.goodput:.2f} req/s ({chosen.per_gpu:.2f} per GPU), P90 TTFT "
        f"{_ms(chosen.latency_ms('p90_ttft_ms'))} ms and TPOT "
        f"{_ms(chosen.latency_ms('p90_tpot_ms'))} ms at that rate; bottleneck: "
        f"{chosen.bottleneck}.",
    ]
    best = result.best
    if best is not None and best is not chosen:
        lines.append(
            f"Note: {best.deployment.label()} is predicted higher ({best.goodput:.2f} req/s); "
            "pdkit deploys prefill/decode, so the best PD deployment is written here."
        )
    colocated = result.best_colocated
    if colocated is not None and colocated.goodput > 0 and chosen.deployment.kind == "pd":
        lines.append(
            f"Best colocated: {colocated.deployment.label()}, {colocated.goodput:.2f} req/s on "
            f"{colocated.gpus} GPUs: PD gives {chosen.goodput / colocated.goodput:.2f}x the "
            f"goodput, {chosen.per_gpu / colocated.per_gpu:.2f}x per GPU."
        )
    runners = [r for r in result.ranked if r is not chosen][:3]
    if runners:
        lines.append(
            "Runners-up: "
            + "; ".join(
                f"{r.deployment.label()} {r.goodput:.2f} req/s on {r.gpus} GPUs" for r in runners
            )
            + "."
        )
    if variants:
        lines.append(
            "If lengths change: "
            + ", ".join(f"{v.describe()} {v.goodput:.2f} req/s ({v.change:+.0%})" for v in variants)
            + "."
        )
    if p.generic_hosts:
        lines.append(
            "The hosts are placeholders: put in your hosts' names, addresses and RDMA NICs."
        )
    lines.append(
        "Measure it: pdkit up, then pdkit bench THIS_FILE --search --out RUN; "
        "pdkit size THIS_FILE --calibrate RUN fits the model to it."
    )
    return lines


def role_notes(result: SizingResult, chosen: Rated) -> dict[str, list[str]]:
    """A comment above `prefill:` and `decode:`: the instances and what one sustains."""
    d = chosen.deployment
    notes: dict[str, list[str]] = {}
    caps = result.capacities
    speed = result.problem.speed
    for role, group, table in (
        ("prefill", d.prefill, caps.prefill),
        ("decode", d.decode, caps.decode),
    ):
        if group is None:
            continue
        found = table.get(group.option)
        one = found.single if isinstance(found, GroupRate) else found
        rate = f"; one alone sustains about {one * speed:.2f} req/s" if one else ""
        notes[role] = [f"{group.count} x {group.option.describe()}{rate} in the model."]
    return notes


def calibration_table(fit: Fit) -> Table:
    """Per load point: measured P50/P90 TTFT and TPOT, predicted before and after the fit."""
    table = _table("Latencies per load point (ms, P50/P90): measured, model before, model after")
    for name in ("rate", "TTFT meas.", "before", "after", "TPOT meas.", "before", "after"):
        table.add_column(name, justify="right", no_wrap=True)

    def pair(latencies: Latencies, metric: str) -> str:
        return (
            f"{_ms(getattr(latencies, f'p50_{metric}_ms'))}/"
            f"{_ms(getattr(latencies, f'p90_{metric}_ms'))}"
        )

    for p in fit.points:
        table.add_row(
            f"{p.rate:g}",
            pair(p.measured, "ttft"),
            pair(p.before, "ttft"),
            pair(p.after, "ttft"),
            pair(p.measured, "tpot"),
            pair(p.before, "tpot"),
            pair(p.after, "tpot"),
        )
    return table


def calibration_json(
    calibration: Calibration,
    fit: Fit,
    *,
    store: Path,
    points: int,
    speed: float,
    goodputs: tuple[float | None, float, float],
) -> dict[str, Any]:
    """What `pdkit size --calibrate` found: the factors, the per-point latencies (wall ms)
    before and after, and the goodput measured and predicted before and after."""
    measured, before, after = goodputs
    return {
        "calibration": asdict(calibration),
        "store": str(store),
        "speed": speed,
        "points": points,
        "fitted_points": [
            {
                "rate": p.rate,
                "measured": asdict(p.measured),
                "before": asdict(p.before),
                "after": asdict(p.after),
            }
            for p in fit.points
        ],
        "goodput": {"measured": measured, "before": before, "after": after},
    }
