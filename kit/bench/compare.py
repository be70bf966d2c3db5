"""`pdkit bench compare A B ...`: several runs side by side (for example colocated against
2P1D, per GPU): one table and one figure from their `summary.json` files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kit.bench.plots import compare_figure
from kit.errors import PdkitError


def load_run(folder: Path) -> dict[str, Any]:
    """A run's summary.json, labelled by its folder name unless it has a label."""
    path = folder / "summary.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except OSError as exc:
        raise PdkitError(
            f"{path} cannot be read ({exc.strerror}). To fix: give folders that "
            "`pdkit bench --out DIR` wrote."
        ) from exc
    except ValueError as exc:
        raise PdkitError(f"{path} is not a bench summary ({exc}).") from exc
    data["label"] = data.get("label") or folder.name
    return data


def _best_throughput(run: dict[str, Any]) -> float:
    return max((p["throughput_rps"] for p in run["points"]), default=0.0)


def compare_table(runs: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="Runs", title_justify="left", header_style="bold", pad_edge=False)
    for name in ("run", "GPUs", "goodput/s", "per GPU", "confirmed", "best thru/s", "points"):
        table.add_column(name, justify="left" if name == "run" else "right", no_wrap=True)
    for run in runs:
        search = run.get("search") or {}
        goodput = search.get("goodput")
        gpus = run.get("gpus")
        per_gpu = f"{goodput / gpus:.2f}" if goodput is not None and gpus else "-"
        boundary = search.get("boundary_attainment") or []
        table.add_row(
            run["label"],
            str(gpus or "-"),
            f"{goodput:.2f}" if goodput is not None else "-",
            per_gpu,
            f"{search.get('confirmed', 0)}/{len(boundary)}" if boundary else "-",
            f"{_best_throughput(run):.2f}",
            str(len(run["points"])),
        )
    return table


def compare(folders: Sequence[Path], out: Path, console: Console, per_gpu: bool) -> Path:
    """Print the table of `folders`' runs and write compare.png into `out`."""
    if len(folders) < 2:
        raise PdkitError("give at least two run folders to compare.")
    runs = [load_run(f) for f in folders]
    if per_gpu and not all(run.get("gpus") for run in runs):
        missing = ", ".join(run["label"] for run in runs if not run.get("gpus"))
        raise PdkitError(
            f"--per-gpu needs every run's GPU count; {missing} has none. To fix: bench a "
            "topology (its GPUs are counted) or pass --gpus N with --url."
        )
    console.print(compare_table(runs))
    out.mkdir(parents=True, exist_ok=True)
    path = compare_figure(out, runs, per_gpu)
    console.print(f"Figure: {path}", markup=False)
    return path
