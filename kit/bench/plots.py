"""The figures of a bench run, as PNG files (matplotlib, Agg: no display needed).

- attainment.png: SLO attainment against the offered rate, the target as a line and the
  goodput rate marked (the figure of DistServe and the PD literature);
- ttft_cdf.png, tpot_cdf.png: the distribution of TTFT and TPOT at each rate, the SLO marked;
- latency_throughput.png: P50/P90 TTFT and TPOT against the achieved throughput;
- timeline.png: SLO attainment and failed requests per few seconds over each point (what a
  rolling restart or a scale-up under load did);
- compare.png (`pdkit bench compare`): several runs' attainment against rate in one figure,
  per GPU when every run knows its GPU count.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.bench.records import RequestRecord
from kit.errors import PdkitError
from kit.topology.schema import SLO

TIMELINE_WINDOW_S = 5.0
PLOTS_EXTRA = "pip install 'sglang-pdkit[bench]'"


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise PdkitError(
            f"the plots need matplotlib, which is not installed. To fix: {PLOTS_EXTRA}."
        ) from exc
    return plt


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n * 100 for i in range(n)]


def attainment_figure(
    out: Path,
    points: Sequence[dict[str, Any]],
    slo: dict[str, float],
    goodput: float | None,
    title: str,
    *,
    predicted: Sequence[tuple[float, float]] = (),
) -> Path:
    """Attainment (%) against offered rate; `points` are summary.json point dicts."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rated = sorted((p for p in points if p.get("rate") is not None), key=lambda p: p["rate"])
    ax.plot(
        [p["rate"] for p in rated],
        [p["attainment"] * 100 for p in rated],
        "o-",
        color="tab:blue",
        label="measured",
    )
    growing = [p for p in rated if p.get("queue_growing")]
    if growing:
        ax.plot(
            [p["rate"] for p in growing],
            [p["attainment"] * 100 for p in growing],
            "x",
            color="tab:red",
            markersize=11,
            markeredgewidth=2,
            linestyle="none",
            label="queue growing: not sustained",
        )
    if predicted:
        ax.plot(
            [r for r, _ in predicted],
            [a * 100 for _, a in predicted],
            "s--",
            color="tab:gray",
            alpha=0.8,
            label="kit/perf model",
        )
    target = slo["attainment"] * 100
    ax.axhline(target, color="tab:red", linestyle=":", label=f"target {target:.0f}%")
    if goodput:
        ax.axvline(goodput, color="tab:green", linestyle="--", label=f"goodput {goodput:g} req/s")
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel(
        f"SLO attainment (%)\nTTFT <= {slo['ttft_ms']:g} ms and TPOT <= {slo['tpot_ms']:g} ms"
    )
    ax.set_ylim(-2, 102)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    ax.set_title(title)
    fig.tight_layout()
    path = out / "attainment.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def timeline_figure(
    out: Path,
    records: Sequence[RequestRecord],
    slo: dict[str, float],
    title: str,
    window_s: float = TIMELINE_WINDOW_S,
) -> Path:
    """SLO attainment (%) and failed requests per `window_s` seconds of send time, one line per
    rate point: what a run looked like while something changed under it (a rolling restart, a
    scale-up). Warm-up requests count too; a failed request misses the SLO."""
    plt = _pyplot()
    objective = SLO(**slo)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    most_failed = 0
    points: dict[float | None, list[RequestRecord]] = {}
    for record in records:
        points.setdefault(record.rate, []).append(record)
    for rate, mine in points.items():
        windows: dict[int, list[RequestRecord]] = {}
        for record in mine:
            windows.setdefault(int(record.sent_s // window_s), []).append(record)
        keys = sorted(windows)
        xs = [(k + 0.5) * window_s for k in keys]
        met = [sum(r.meets(objective) for r in windows[k]) / len(windows[k]) * 100 for k in keys]
        label = f"{rate:g} req/s" if rate is not None else "closed loop"
        top.plot(xs, met, "o-", markersize=3, label=label)
        failed = [sum(not r.ok for r in windows[k]) for k in keys]
        most_failed = max([most_failed, *failed])
        bottom.bar(xs, failed, width=window_s * 0.8)
    target = slo["attainment"] * 100
    top.axhline(target, color="tab:red", linestyle=":", label=f"target {target:.0f}%")
    top.set_ylabel(
        f"SLO attainment (%) per {window_s:g} s\nTTFT <= {slo['ttft_ms']:g} ms, "
        f"TPOT <= {slo['tpot_ms']:g} ms"
    )
    top.set_ylim(-2, 102)
    top.grid(alpha=0.3)
    top.legend(loc="lower left", fontsize="small")
    top.set_title(f"{title}: over the run")
    bottom.set_ylabel("failed")
    bottom.set_ylim(0, max(most_failed, 1) * 1.15)
    bottom.yaxis.get_major_locator().set_params(integer=True)
    bottom.set_xlabel("time since the point started (s, by send time)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cdf_figures(
    out: Path, by_rate: dict[str, dict[str, list[float]]], slo: dict[str, float], title: str
) -> list[Path]:
    """TTFT and TPOT CDFs, one line per point (`by_rate`: label -> {"ttft": [...], ...})."""
    plt = _pyplot()
    paths = []
    for metric, limit, name in (("ttft", slo["ttft_ms"], "TTFT"), ("tpot", slo["tpot_ms"], "TPOT")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, values in by_rate.items():
            if values.get(metric):
                xs, ys = _cdf(values[metric])
                ax.plot(xs, ys, label=label)
        ax.axvline(limit, color="tab:red", linestyle=":", label=f"SLO {limit:g} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("requests (%)")
        ax.set_ylim(0, 101)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        ax.set_title(f"{title}: {name} distribution")
        fig.tight_layout()
        path = out / f"{metric}_cdf.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def latency_throughput_figure(
    out: Path, points: Sequence[dict[str, Any]], slo: dict[str, float], title: str
) -> Path:
    """P50 and P90 TTFT and TPOT against achieved throughput (requests/s)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    ordered = sorted(points, key=lambda p: p["throughput_rps"])
    xs = [p["throughput_rps"] for p in ordered]
    for ax, metric, limit, name in (
        (left, "ttft_ms", slo["ttft_ms"], "TTFT"),
        (right, "tpot_ms", slo["tpot_ms"], "TPOT"),
    ):
        for q, style in (("p50", "o-"), ("p90", "s--")):
            ys = [p[metric][q] for p in ordered]
            pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            ax.plot([x for x, _ in pairs], [y for _, y in pairs], style, label=f"{q.upper()}")
        ax.axhline(limit, color="tab:red", linestyle=":", label=f"SLO {limit:g} ms")
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{title}: latency against throughput")
    fig.tight_layout()
    path = out / "latency_throughput.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_figure(out: Path, runs: Sequence[dict[str, Any]], per_gpu: bool) -> Path:
    """Each run's attainment against offered rate (per GPU with `per_gpu`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    targets = set()
    for run in runs:
        gpus = run.get("gpus") or 1
        scale = gpus if per_gpu else 1
        rated = sorted(
            (p for p in run["points"] if p.get("rate") is not None), key=lambda p: p["rate"]
        )
        line = ax.plot(
            [p["rate"] / scale for p in rated],
            [p["attainment"] * 100 for p in rated],
            "o-",
            label=run["label"],
        )
        goodput = (run.get("search") or {}).get("goodput")
        if goodput:
            ax.axvline(goodput / scale, color=line[0].get_color(), linestyle="--", alpha=0.6)
        targets.add(run["slo"]["attainment"] * 100)
    for target in targets:
        ax.axhline(target, color="tab:red", linestyle=":", label=f"target {target:.0f}%")
    ax.set_xlabel("offered rate per GPU (requests/s)" if per_gpu else "offered rate (requests/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(-2, 102)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    ax.set_title("SLO attainment" + (" per GPU" if per_gpu else ""))
    fig.tight_layout()
    path = out / "compare.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
