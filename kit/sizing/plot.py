"""The Pareto chart of a sizing: goodput per GPU against the speed one user sees (output
tokens/s at the goodput rate, 1000 / P50 TPOT), one marker per deployment served, PD and
colocated apart, the frontier drawn and the chosen deployment marked. A deployment on the
frontier is one no other beats on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kit.bench.plots import _pyplot
from kit.sizing.search import Rated, SizingResult


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (x, y) points no other point beats on both, by x ascending (both maximised)."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not out or y > out[-1][1]:
            out.append((x, y))
    return sorted(out)


def _xy(rated: Rated) -> tuple[float, float] | None:
    speed = rated.tokens_per_user_s
    return None if speed is None else (speed, rated.per_gpu)


def pareto_figure(path: Path, result: SizingResult, chosen: Rated | None, title: str) -> Path:
    """Write the chart (see the module doc) to `path`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    all_points = []
    for kind, marker, color, name in (
        ("pd", "o", "tab:blue", "prefill/decode"),
        ("colocated", "s", "tab:orange", "colocated"),
    ):
        rated = [r for r in result.ranked if r.deployment.kind == kind and _xy(r)]
        points = [xy for r in rated if (xy := _xy(r))]
        all_points += points
        if points:
            ax.scatter(
                [x for x, _ in points],
                [y for _, y in points],
                marker=marker,
                color=color,
                label=name,
                zorder=3,
            )
    edge = frontier(all_points)
    if len(edge) > 1:
        ax.plot(
            [x for x, _ in edge],
            [y for _, y in edge],
            "--",
            color="tab:gray",
            label="Pareto frontier",
            zorder=2,
        )
    named = (chosen, result.best_colocated)
    labelled = sorted(
        ((xy, r) for r in result.ranked if (xy := _xy(r)) and (xy in edge or r in named)),
        key=lambda item: item[0],
    )
    for i, (xy, r) in enumerate(labelled):
        # Neighbours on the frontier alternate above and below their marker.
        ax.annotate(
            r.deployment.label(),
            xy,
            textcoords="offset points",
            xytext=(8, 7) if i % 2 == 0 else (8, -13),
            fontsize="x-small",
        )
    if chosen is not None and (xy := _xy(chosen)) is not None:
        ax.scatter(
            [xy[0]],
            [xy[1]],
            marker="*",
            s=260,
            color="tab:green",
            zorder=4,
            label=f"chosen: {chosen.deployment.shape()}",
        )
    tpot = result.problem.slo.tpot_ms
    ax.axvline(1000 / tpot, color="tab:red", linestyle=":", label=f"TPOT SLO {tpot:g} ms")
    ax.set_xlabel("per-user speed at the goodput rate (output tokens/s, 1000 / P50 TPOT)")
    ax.set_ylabel("goodput per GPU (requests/s)")
    if all_points:  # room for the labels above and to the right of the markers
        xs, ys = [x for x, _ in all_points], [y for _, y in all_points]
        span = max(max(xs) - min(xs), 1.0)
        ax.set_xlim(min(*xs, 1000 / tpot) - 0.05 * span, max(xs) + 0.3 * span)
        ax.set_ylim(0, max(ys) * 1.15)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
