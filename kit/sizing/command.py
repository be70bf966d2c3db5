"""`pdkit size` from its options: build the problem, search, print the answer, write the
topology, the chart and the JSON; or, with `--calibrate`, fit the model to a bench run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.timing import Efficiency
from kit.perf.workload import WorkloadSpec
from kit.sizing import calibration, emit, report
from kit.sizing.plot import pareto_figure
from kit.sizing.prefix import prefix_lines, prefix_report
from kit.sizing.problem import (
    SizingError,
    SizingProblem,
    base_gpu,
    generic_base,
    load_base,
    make_problem,
)
from kit.sizing.robustness import Variant, robustness
from kit.sizing.search import Rated, SizingResult, size
from kit.topology.schema import SLO


@dataclass(frozen=True)
class SizeArgs:
    """Every option of `pdkit size`, as given (None: not given)."""

    topology: Path | None = None
    model: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    gpus_per_host: int = 8
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    attainment: float | None = None
    input_len: str = "512"
    output_len: str = "64"
    arrivals: str = "poisson"
    trace: Path | None = None
    requests: int = 200
    seed: int = 0
    target_rate: float | None = None
    emit: Path | None = None
    out: Path | None = None
    as_json: bool = False
    exhaustive: bool = False
    top: int = 10
    robustness: bool = True
    calibrate: Path | None = None
    use_calibration: bool = True
    prefix_share: float = 0.0
    prefix_groups: int = 0


def run(args: SizeArgs, console: Console) -> None:
    """What `pdkit size` does with `args` (see the module doc)."""
    if args.calibrate is not None:
        calibrate(args, console)
        return
    problem, note = build_problem(args)
    if not args.as_json:
        for line in report.question(problem, note):
            console.print(line, markup=False, highlight=False)
    result = size(problem, exhaustive=args.exhaustive)
    best = result.best
    variants: list[Variant] = []
    if args.robustness and best is not None:
        variants = robustness(problem, best)
    files: dict[str, str] = {}
    chosen = best if best is not None and best.deployment.kind == "pd" else result.best_pd
    if args.emit is not None:
        files["topology"] = str(_emit(args.emit, result, chosen, variants, note))
    if args.out is not None:
        files.update(_write_out(args.out, result, chosen, variants, note))
    prefix = (
        prefix_report(problem, chosen, args.prefix_share, args.prefix_groups)
        if chosen is not None
        else None
    )
    if args.as_json:
        data = report.result_json(result, _efficiency_json(problem, note), variants, files)
        if prefix is not None:
            data["prefix_caching"] = prefix
        print(json.dumps(data, indent=2))
        return
    _print(console, result, variants, files, args.top)
    for line in prefix_lines(prefix) if prefix is not None else []:
        console.print(line, markup=False, highlight=False)


def build_problem(args: SizeArgs) -> tuple[SizingProblem, str]:
    """The problem the options describe, and a note on the efficiency used."""
    if args.requests < 1:
        raise SizingError("--requests must be at least 1.")
    if args.top < 1:
        raise SizingError("--top must be at least 1.")
    if not 0 <= args.prefix_share < 1 or (args.prefix_share > 0 and args.prefix_groups < 1):
        raise SizingError(
            "--prefix-share must be in [0, 1) and needs --prefix-groups N (N >= 1 groups)."
        )
    if args.topology is not None:
        if args.gpus is not None:
            raise SizingError(
                "--gpus sizes generic hosts; with a topology its hosts: section says the GPUs. "
                "To fix: drop --gpus, or drop the topology."
            )
        base, topology = load_base(args.topology)
        if topology.slurm is not None:
            slurm = topology.slurm
            raise SizingError(
                f"{args.topology} has launcher: slurm: its hosts are the allocation's nodes, "
                "known only once Slurm gives them, so there is no hosts: section to size. "
                f"To fix: size generic hosts of its shape, e.g. pdkit size --model "
                f"{topology.model.path} --gpu {slurm.gpu_type or 'H100-SXM'} --gpus "
                f"{slurm.nodes * slurm.gpus_per_node} --gpus-per-host {slurm.gpus_per_node}."
            )
        model_path = args.model or topology.model.path
        gpu = base_gpu(topology, args.gpu)
        hosts_gpu = {h.gpu_type for h in topology.hosts if h.gpu_type and h.gpus > 0}
        if (
            args.gpu
            and hosts_gpu
            and {gpu_spec(t).name for t in hosts_gpu} != {gpu_spec(args.gpu).name}
        ):
            raise SizingError(
                f"--gpu {args.gpu} but the topology's hosts have gpu_type "
                f"{', '.join(sorted(hosts_gpu))}. To fix: drop --gpu, or fix the hosts."
            )
        base_slo = topology.slo
        generic = False
    else:
        missing = [
            flag
            for flag, value in (("--model", args.model), ("--gpu", args.gpu), ("--gpus", args.gpus))
            if not value
        ]
        if missing:
            raise SizingError(
                f"give {', '.join(missing)} (or a topology whose hosts: section says the GPUs), "
                "e.g. pdkit size --model meta-llama/Llama-2-13b-hf --gpu A100-80G --gpus 8."
            )
        assert args.model is not None and args.gpu is not None and args.gpus is not None
        if args.gpus_per_host < 1:
            raise SizingError("--gpus-per-host must be at least 1.")
        model_path, gpu = args.model, args.gpu
        gpu_spec(gpu)  # an unknown GPU is reported before the hosts are made up
        base = generic_base(_name(model_path), model_path, gpu, args.gpus, args.gpus_per_host)
        base_slo = SLO()
        generic = True
    slo = SLO(
        ttft_ms=args.ttft_ms or base_slo.ttft_ms,
        tpot_ms=args.tpot_ms or base_slo.tpot_ms,
        attainment=args.attainment or base_slo.attainment,
    )
    workload = WorkloadSpec.from_options(
        input_len=args.input_len,
        output_len=args.output_len,
        arrivals=args.arrivals,
        trace=args.trace,
        count=args.requests,
        seed=args.seed,
    )
    efficiency, note = _efficiency(model_path, gpu, args.use_calibration)
    problem = make_problem(
        base=base,
        model_path=model_path,
        gpu=gpu,
        slo=slo,
        workload=workload,
        target_rate=args.target_rate,
        efficiency=efficiency,
        generic_hosts=generic,
    )
    return problem, note


def _name(model_path: str) -> str:
    """A topology name from a model path: 'meta-llama/Llama-2-13b-hf' -> 'llama-2-13b-hf'."""
    base = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9_.-]+", "-", base).strip("-._") or "sized"


def _efficiency(model_path: str, gpu: str, use: bool) -> tuple[Efficiency, str]:
    spec = gpu_spec(gpu)
    default = Efficiency.for_gpu(spec)
    where = f"measured on {spec.name}" if spec.measured else "kit/perf's defaults"
    defaults = f"compute {default.compute:g}, memory {default.memory:g} ({where})"
    if not use:
        return default, defaults + "; stored calibrations ignored (--no-calibration)"
    found = calibration.load(
        resolve_model(model_path).name, gpu_spec(gpu).name, calibration.store_path()
    )
    if found is None:
        return default, defaults
    return found.efficiency, found.describe()


def _efficiency_json(problem: SizingProblem, note: str) -> dict[str, Any]:
    e = problem.efficiency
    return {"compute": e.compute, "memory": e.memory, "source": note}


def _emit(
    path: Path, result: SizingResult, chosen: Rated | None, variants: list[Variant], note: str
) -> Path:
    if chosen is None:
        raise SizingError(
            "--emit: no prefill/decode deployment serves the SLO on these GPUs, so there is no "
            "topology to write. To fix: more GPUs, a looser SLO, or shorter requests."
        )
    data = emit.topology_data(result.problem, chosen.deployment)
    header = report.emitted_header(result, chosen, variants if chosen is result.best else [], note)
    emit.write(path, emit.render(data, header, report.role_notes(result, chosen)))
    return path


def _write_out(
    folder: Path, result: SizingResult, chosen: Rated | None, variants: list[Variant], note: str
) -> dict[str, str]:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SizingError(f"--out {folder}: cannot create it ({exc.strerror}).") from exc
    p = result.problem
    title = (
        f"{p.model.name} on {p.gpus} x {p.gpu.name}: TTFT <= {p.slo.ttft_ms:g} ms, "
        f"TPOT <= {p.slo.tpot_ms:g} ms, {p.slo.attainment:.0%}"
    )
    chart = pareto_figure(folder / "pareto.png", result, result.best or chosen, title)
    files = {"pareto": str(chart), "json": str(folder / "size.json")}
    data = report.result_json(result, _efficiency_json(p, note), variants, files)
    (folder / "size.json").write_text(json.dumps(data, indent=2) + "\n")
    return files


def _print(
    console: Console,
    result: SizingResult,
    variants: list[Variant],
    files: dict[str, str],
    top: int,
) -> None:
    console.print(report.search_line(result), markup=False, highlight=False)
    if not result.ranked:
        console.print(
            "no deployment meets the SLO at any rate. To fix: relax the SLO, shorten the "
            "requests, or use more or larger GPUs.",
            markup=False,
        )
        return
    console.print(report.ranked_table(result, top))
    for line in (report.target_line(result), report.comparison(result)):
        if line:
            console.print(line, markup=False, highlight=False)
    best = result.best
    if variants and best is not None:
        for line in report.robustness_lines(best, variants):
            console.print(line, markup=False, highlight=False)
    if "topology" in files:
        console.print(
            f"wrote {files['topology']} (pdkit validate accepts it)", markup=False, highlight=False
        )
    if "pareto" in files:
        console.print(f"wrote {files['pareto']} and {files['json']}", markup=False, highlight=False)


def calibrate(args: SizeArgs, console: Console) -> calibration.Calibration:
    """Fit the efficiency factors to the bench run in `args.calibrate` and store them."""
    from kit.bench.predict import plan_cluster  # noqa: PLC0415
    from kit.bench.run import deployment_json  # noqa: PLC0415
    from kit.plan.resolve import resolve  # noqa: PLC0415

    assert args.calibrate is not None
    if args.topology is None:
        raise SizingError(
            "--calibrate RUN_DIR needs the topology the run measured. To fix: pdkit size "
            "TOPOLOGY --calibrate RUN_DIR."
        )
    run_ = calibration.read_run(args.calibrate)
    plan = resolve(args.topology)
    differs = run_.mismatch(deployment_json(plan))
    if differs:
        raise SizingError(
            f"--calibrate {args.calibrate}: the run measured another deployment than "
            f"{args.topology} ({'; '.join(differs)}). To fix: give the topology the run "
            f"measured, or bench this one: pdkit bench {args.topology} --search --out DIR."
        )
    cluster, speed = plan_cluster(plan)
    instances = cluster.prefill or cluster.decode or cluster.colocated
    assert instances is not None
    model, gpu = instances.config.model.name, instances.config.gpu.name
    store = calibration.store_path()
    previous = calibration.load(model, gpu, store) if args.use_calibration else None
    start = previous.efficiency if previous else Efficiency.for_gpu(instances.config.gpu)
    points = calibration.usable(run_)
    fitted = calibration.fit(cluster, speed, points, start)
    before = calibration.predicted_goodput(cluster, speed, run_, fitted.before)
    after = calibration.predicted_goodput(cluster, speed, run_, fitted.after)
    result = calibration.Calibration(
        model=model,
        gpu=gpu,
        compute=round(fitted.after.compute, 4),
        memory=round(fitted.after.memory, 4),
        run=str(args.calibrate),
        fitted_at=calibration.stamp(),
        error_before=round(fitted.error_before, 4),
        error_after=round(fitted.error_after, 4),
    )
    calibration.save(result, store)
    measured = run_.goodput
    summary = report.calibration_json(
        result,
        fitted,
        store=store,
        points=len(run_.points),
        speed=speed,
        goodputs=(measured, before, after),
    )
    written = args.calibrate / "calibration.json"
    try:
        written.write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as exc:
        raise SizingError(f"--calibrate: cannot write {written} ({exc.strerror}).") from exc
    if args.as_json:
        print(json.dumps(summary, indent=2))
        return result
    lines = [
        f"pdkit size --calibrate {args.calibrate}: {model} on {gpu}"
        + (f", PDKIT_SIM_SPEED {speed:g}" if speed != 1 else "")
        + f"; {len(run_.points)} load points, {len(points)} with at least half the requests "
        "within the SLO used",
        f"efficiency before: compute {fitted.before.compute:.3f}, memory "
        f"{fitted.before.memory:.3f}; after: compute {fitted.after.compute:.3f}, memory "
        f"{fitted.after.memory:.3f}",
    ]
    if run_.deployment is None:
        lines.append(
            f"note: the run does not record what it measured (a --url run, or one from before "
            f"pdkit recorded it): make sure it measured {args.topology}"
        )
    for line in lines:
        console.print(line, markup=False, highlight=False)
    console.print(report.calibration_table(fitted))
    console.print(
        f"latency error (mean |predicted / measured - 1| of P50 and P90 TTFT and TPOT): "
        f"{fitted.error_before:.1%} before, {fitted.error_after:.1%} after",
        markup=False,
        highlight=False,
    )
    if measured:
        console.print(
            f"goodput: measured {measured:g} req/s; predicted {before:.2f} before (measured / "
            f"predicted {measured / before:.2f}), {after:.2f} after ({measured / after:.2f})",
            markup=False,
            highlight=False,
        )
    else:
        console.print(
            f"goodput predicted {before:.2f} req/s before, {after:.2f} after (the run has no "
            "search result to compare with)",
            markup=False,
            highlight=False,
        )
    console.print(
        f"saved to {store}: the next pdkit size of {model} on {gpu} uses it "
        f"(--no-calibration ignores it); the fit's numbers are in {written}",
        markup=False,
        highlight=False,
    )
    return result
