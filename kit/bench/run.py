"""`pdkit bench`: measure a live deployment (or any OpenAI-compatible server) under load.

One run is a list of load points: given rates, a closed loop at a concurrency, or a search for
the goodput rate. Every point is summarized as it ends; with `--out` the run leaves
`requests.jsonl` (every request of every point), `summary.json` (everything printed, as data)
and the PNG figures. With a topology the router's URL, model name and API key come from the
Plan, and kit/perf's model of the same instances predicts the goodput next to the measured one.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from kit.aio import run
from kit.bench.client import Client, Target
from kit.bench.metrics import PointSummary, summarize
from kit.bench.plots import (
    attainment_figure,
    cdf_figures,
    latency_throughput_figure,
    timeline_figure,
)
from kit.bench.predict import Prediction, predict, predicted_attainment
from kit.bench.records import RequestRecord, write_records
from kit.bench.runner import LoadSpec, run_point
from kit.bench.search import SearchResult, SearchSpec, search_goodput
from kit.bench.view import PointLine, more_table, notes_lines, point_line, points_table
from kit.errors import PdkitError
from kit.perf.workload import STEADY_LIFETIMES, WorkloadSpec
from kit.topology.plan_types import Plan
from kit.topology.schema import SLO

SUMMARY_VERSION = 1


@dataclass(frozen=True)
class BenchOptions:
    """What to run: `rates` (requests/s) or a `search`, or a closed loop (`load.concurrency`);
    the workload, how points are driven, the SLO, and where results go."""

    workload: WorkloadSpec
    load: LoadSpec
    slo: SLO
    rates: tuple[float, ...] = ()
    search: SearchSpec | None = None
    out: Path | None = None
    as_json: bool = False
    predict: bool = True
    label: str = ""
    gpus: int | None = None
    watch: dict[str, int] = field(default_factory=dict)
    """The deployment's processes on this machine (name -> pid): their CPU use is checked."""


@dataclass
class BenchReport:
    """A finished run: its points in the order run, the search (if any), the prediction."""

    target: Target
    options: BenchOptions
    points: list[PointSummary] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    search: SearchResult | None = None
    prediction: Prediction | None = None
    prediction_error: str = ""
    predicted_curve: list[tuple[float, float]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    deployment: dict[str, Any] | None = None
    """What was measured (`deployment_json`), when bench had the topology."""
    stopped_early: bool = False
    """Ctrl-C (or SIGTERM) ended the run before its points did: the last point is what was
    sent until then."""

    def to_json(self) -> dict[str, Any]:
        opts = self.options
        out: dict[str, Any] = {
            "version": SUMMARY_VERSION,
            "label": opts.label,
            "started_at": self.started_at,
            "target": {
                "url": self.target.url,
                "model": self.target.model,
                **({"via": self.target.via} if self.target.via else {}),
            },
            "gpus": opts.gpus,
            "workload": opts.workload.describe(),
            "load": {
                "api": opts.load.api,
                "stream": opts.load.stream,
                "timeout_s": opts.load.timeout_s,
                "warmup": opts.load.warmup,
                "duration_s": opts.load.duration_s,
                "concurrency": opts.load.concurrency,
                "prefix_share": opts.load.prefix_share,
                "prefix_groups": opts.load.prefix_groups,
            },
            "slo": opts.slo.model_dump(),
            "points": [p.to_json() for p in self.points],
            "stopped_early": self.stopped_early,
        }
        if self.deployment is not None:
            out["deployment"] = self.deployment
        if self.search is not None:
            out["search"] = {
                "goodput": self.search.goodput,
                "met_below": self.search.met_below,
                "missed_above": self.search.missed_above,
                "boundary_attainment": [p.attainment for p in self.search.boundary],
                "confirmed": self.search.confirmed,
                "capped": self.search.capped,
            }
        if self.prediction is not None:
            out["prediction"] = {
                "goodput": self.prediction.goodput,
                "speed": self.prediction.speed,
                "curve": [{"rate": r, "attainment": a} for r, a in self.predicted_curve],
            }
        elif self.prediction_error:
            out["prediction"] = {"error": self.prediction_error}
        return out


def deployment_json(plan: Plan) -> dict[str, Any]:
    """The deployment a run measured, as `pdkit size --calibrate` checks it: the model, and per
    role its instance count and parallelism (its rank-0 process's)."""
    roles: dict[str, Any] = {}
    for role in ("prefill", "decode"):
        processes = plan.role(role)
        if processes:
            roles[role] = {
                "instances": len({p.instance_name for p in processes}),
                **processes[0].parallelism.model_dump(),
            }
    return {"name": plan.name, "engine": plan.engine, "model": plan.model.path, "roles": roles}


def _run_id() -> str:
    return os.urandom(4).hex()


async def _measure(
    client: Client,
    options: BenchOptions,
    report: BenchReport,
    console: Console,
    rate: float | None,
    *,
    stop: asyncio.Event,
) -> PointSummary:
    if stop.is_set():
        raise _Stopped
    index = len(report.points)
    label = f"{rate:g} req/s" if rate is not None else f"{options.load.concurrency} users"
    with PointLine(console, label) as line:
        point = await run_point(
            client,
            options.workload,
            rate,
            options.load,
            run_id=f"{_run_id()}-p{index}",
            on_progress=line.update,
            is_good=lambda r: r.meets(options.slo),
            watch=options.watch,
            stop=stop,
        )
    summary = summarize(point, options.slo)
    report.points.append(summary)
    report.records += point.records
    if not options.as_json:
        console.print(point_line(summary), markup=False, highlight=False)
    return summary


class _Stopped(Exception):
    """The run was stopped (Ctrl-C) before a point began."""


def _stop_on_signal(stop: asyncio.Event) -> None:
    """The first Ctrl-C (or SIGTERM) sets `stop`: no request is sent after it, those in flight
    finish and the results are written; a second Ctrl-C aborts at once."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        stop.set()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)  # SIGINT's default again: the next one aborts
        print(
            "pdkit bench: stopping: no new requests; the ones in flight finish and the results "
            "are written (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, first)


def _write_before_abort(stopped: bool) -> None:
    """Once the load is over, the results are written: a first Ctrl-C (or SIGTERM) then, when
    none came during the run, lets them be written (the event loop that handled it is gone, and
    the signal's default would end the process with nothing written); the next one aborts."""
    if stopped:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return

    def once(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(
            "pdkit bench: the load is over; the results are being written (Ctrl-C again to abort)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, once)
    signal.signal(signal.SIGTERM, once)


async def _run(target: Target, options: BenchOptions, console: Console) -> BenchReport:
    report = BenchReport(target, options)
    stop = asyncio.Event()
    _stop_on_signal(stop)
    async with Client(target, options.load.timeout_s) as client:
        try:
            if options.search is not None:
                report.search = await search_goodput(
                    lambda rate: _measure(client, options, report, console, rate, stop=stop),
                    options.slo,
                    options.search,
                )
            elif options.load.concurrency is not None:
                await _measure(client, options, report, console, None, stop=stop)
            else:
                for rate in options.rates:
                    await _measure(client, options, report, console, rate, stop=stop)
        except _Stopped:
            pass
    report.stopped_early = stop.is_set()
    return report


def bench(
    target: Target, options: BenchOptions, console: Console, plan: Plan | None = None
) -> BenchReport:
    """Run the points, print them, write the results; returns the report."""
    if not options.as_json:
        what = (
            f"search for the goodput rate from {options.search.start:g} req/s"
            if options.search
            else (
                f"{options.load.concurrency} concurrent users"
                if options.load.concurrency
                else "rates " + ", ".join(f"{r:g}" for r in options.rates) + " req/s"
            )
        )
        slo = options.slo
        console.print(
            f"[bold]pdkit bench[/] {target.url}{f' ({target.via})' if target.via else ''} "
            f"(model {target.model}): {what}; "
            f"{options.workload.describe()}; SLO TTFT <= {slo.ttft_ms:g} ms, TPOT <= "
            f"{slo.tpot_ms:g} ms, {slo.attainment:.0%} attainment",
            highlight=False,
        )
    report = run(_run(target, options, console))
    _write_before_abort(report.stopped_early)
    if plan is not None:
        report.deployment = deployment_json(plan)
    if plan is not None and options.predict and options.load.concurrency is None:
        _add_prediction(report, plan)
    if options.out is not None:
        write_results(report, options.out)
    if options.as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print(report, console)
    return report


def _add_prediction(report: BenchReport, plan: Plan) -> None:
    options = report.options
    rates = sorted({p.rate for p in report.points if p.rate is not None})
    try:
        report.prediction = predict(plan, options.workload, options.slo)
        report.predicted_curve = [
            (rate, predicted_attainment(plan, options.workload, options.slo, rate))
            for rate in rates
        ]
    except (PdkitError, ValueError) as exc:
        report.prediction_error = str(exc)


def short_points(search: SearchResult, workload: WorkloadSpec, slo: SLO) -> str:
    """A warning when the points at the goodput rate sent requests for fewer than
    `STEADY_LIFETIMES` request lifetimes: such a point ends before the deployment's batch and
    queues reach their steady size, and the goodput is higher than the rate it sustains. Empty
    otherwise, and for a trace (it is as long as it is)."""
    if search.goodput <= 0 or workload.trace or not search.boundary:
        return ""
    life = workload.lifetime_s(slo)
    spans = [p.requests / p.sent_rate for p in search.boundary if p.sent_rate > 0]
    if not spans or min(spans) >= STEADY_LIFETIMES * life:
        return ""
    span = min(spans)
    enough = math.ceil(STEADY_LIFETIMES * life * search.goodput)
    return (
        f"the points at {search.goodput:g} req/s sent for {span:.1f} s, {span / life:.1f} request "
        f"lifetimes (TTFT objective + mean output x TPOT objective = {life:.1f} s): a point that "
        "short ends before the queues reach their steady size, so this goodput can be higher "
        f"than the deployment sustains. --requests {enough} (or more) gives "
        f"{STEADY_LIFETIMES:g} lifetimes."
    )


def _print(report: BenchReport, console: Console) -> None:
    options = report.options
    console.print(points_table(report.points, "Load points (latencies in ms)"))
    console.print(more_table(report.points))
    for line in notes_lines(report.points):
        console.print(f"  note: {line}", markup=False, highlight=False)
    if report.search is not None:
        console.print(f"[bold]{report.search.describe(options.slo)}[/]", highlight=False)
        edge = [
            p
            for p in report.points
            if p.rate is not None and p.rate >= (report.search.met_below or 0.0)
        ]
        short = short_points(report.search, options.workload, options.slo)
        if short:
            console.print(f"warning: {short}", style="yellow", highlight=False)
        bound = sorted({f"{kind}-bound" for p in edge for kind in p.bottlenecks})
        if bound:
            console.print(
                f"warning: points at and above the goodput rate were {' and '.join(bound)}: this "
                "goodput is the machine's, not the deployment's. Slow the emulated GPUs "
                "(PDKIT_SIM_SPEED, with the SLO stretched alike: make bench-goodput) or run the "
                "client on another machine.",
                style="yellow",
                highlight=False,
            )
    if report.prediction is not None:
        line = f"kit/perf predicts goodput {report.prediction.describe()}"
        if report.search is not None and report.search.goodput > 0 and not report.prediction.capped:
            ratio = report.search.goodput / report.prediction.goodput
            line += f"; measured / predicted = {ratio:.2f}"
        console.print(line, highlight=False)
        for rate, attainment in report.predicted_curve:
            measured = [p.attainment for p in report.points if p.rate == rate]
            console.print(
                f"  {rate:g} req/s: predicted attainment {attainment:.1%}, measured "
                + ", ".join(f"{m:.1%}" for m in measured),
                highlight=False,
            )
    elif report.prediction_error:
        console.print(f"no prediction: {report.prediction_error}", markup=False)
    if report.stopped_early:
        console.print(
            "stopped early (Ctrl-C): the last point holds the requests sent until then",
            style="yellow",
            highlight=False,
        )
    if options.out is not None:
        console.print(f"Results in {options.out}/ (requests.jsonl, summary.json, *.png)")


def write_results(report: BenchReport, out: Path) -> list[Path]:
    """requests.jsonl, summary.json and the figures into `out` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "requests.jsonl", report.records)
    summary = report.to_json()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    slo = summary["slo"]
    title = report.options.label or report.target.url
    files = [out / "requests.jsonl", out / "summary.json"]
    search = report.search
    rated = [p for p in summary["points"] if p["rate"] is not None]
    if len({p["rate"] for p in rated}) >= 1:
        files.append(
            attainment_figure(
                out,
                rated,
                slo,
                search.goodput if search else None,
                title,
                predicted=report.predicted_curve,
            )
        )
    # One CDF line per distinct load (a search's repeats at one rate pool together).
    by_point: dict[str, dict[str, list[float]]] = {}
    for record in sorted(report.records, key=lambda r: r.rate or 0.0):
        if record.warmup or not record.ok:
            continue
        values = by_point.setdefault(_label(record, report), {"ttft": [], "tpot": []})
        if record.ttft_ms is not None:
            values["ttft"].append(record.ttft_ms)
        if record.tpot_ms is not None:
            values["tpot"].append(record.tpot_ms)
    files += cdf_figures(out, by_point, slo, title)
    files.append(latency_throughput_figure(out, summary["points"], slo, title))
    files.append(timeline_figure(out, report.records, slo, title))
    return files


def _label(record: RequestRecord, report: BenchReport) -> str:
    if record.rate is not None:
        return f"{record.rate:g} req/s"
    return f"{report.options.load.concurrency} users"
