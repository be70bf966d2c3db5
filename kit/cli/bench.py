"""`pdkit bench`: goodput of a deployment (a topology's router or any OpenAI-compatible URL) at
given rates or searched under its SLO, and `pdkit bench compare` of finished runs. Each option
is a field of `kit.bench.options.BenchArgs`, which checks them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, console, err_console, resolve_plan
from kit.cli.options import (
    ArrivalsOpt,
    AttainmentOpt,
    InputLenOpt,
    JsonOpt,
    OutputLenOpt,
    TpotOpt,
    TtftOpt,
    args_from,
)
from kit.errors import PdkitError

CLI_ONLY = ("targets", "per_gpu")
"""bench's parameters that are not `BenchArgs` fields: which run, and compare's option."""


@app.command(
    epilog="Examples:\n\n"
    "  pdkit bench topologies/local.yaml --rates 1,4 --requests 40 --out runs/local\n\n"
    "  pdkit bench topologies/local.yaml --search --out runs/search\n\n"
    "  pdkit bench --url http://10.0.0.1:30000 --model llama --concurrency 32 --requests 500\n\n"
    "  pdkit bench compare runs/colocated runs/2p1d --per-gpu --out runs/compare\n\n"
    "Lengths: 512, uniform:256,1024, normal:512,64, lognormal:512,0.5 or hist:FILE (tokens). "
    "Arrivals: poisson, constant or gamma:B (B < 1 burstier). A trace (--trace, Mooncake JSONL: "
    "timestamp ms, input_length, output_length, hash_ids) replays its arrivals, scaled to each "
    "rate. Errors and timeouts count as SLO misses.",
)
def bench(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="TOPOLOGY, or `compare RUN_DIR RUN_DIR ...`.",
            metavar="[TOPOLOGY | compare RUN_DIR...]",
            show_default=False,
        ),
    ] = None,
    *,
    url: Annotated[
        str | None, typer.Option("--url", help="OpenAI-compatible base URL instead of a topology.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name (with --url).")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env", help="Variable holding the API key (with --url).", metavar="VAR"
        ),
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", help="One rate (requests/s).", show_default=False)
    ] = None,
    rates: Annotated[
        str | None, typer.Option("--rates", help="Rates, e.g. 1,2,4 (requests/s).", metavar="LIST")
    ] = None,
    search: Annotated[
        bool, typer.Option("--search", help="Search the highest rate that meets the SLO.")
    ] = False,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Closed loop: N users back to back.")
    ] = None,
    requests: Annotated[int, typer.Option("--requests", help="Requests per point.")] = 200,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="No request goes out later than this (s) in a point."),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            "--warmup", help="First requests of each point left out (default 10%, <= 20)."
        ),
    ] = None,
    input_len: InputLenOpt = "512",
    output_len: OutputLenOpt = "64",
    arrivals: ArrivalsOpt = "poisson",
    prefix_share: Annotated[
        float, typer.Option("--prefix-share", help="Share of each prompt its group shares.")
    ] = 0.0,
    prefix_groups: Annotated[
        int, typer.Option("--prefix-groups", help="Groups of prompts with a shared prefix.")
    ] = 0,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Replay a Mooncake-format JSONL trace.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of lengths, arrivals, prompts.")] = 0,
    api: Annotated[str, typer.Option("--api", help="chat or completions.")] = "chat",
    stream: Annotated[
        bool, typer.Option("--stream/--no-stream", help="Stream the answers.")
    ] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per request.")] = 60.0,
    ttft_ms: TtftOpt = None,
    tpot_ms: TpotOpt = None,
    attainment: AttainmentOpt = None,
    start: Annotated[float, typer.Option("--start", help="--search: first rate.")] = 1.0,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="--search: relative precision.")
    ] = 0.1,
    repeat: Annotated[
        int, typer.Option("--repeat", help="--search: extra runs at the goodput rate.")
    ] = 2,
    max_points: Annotated[int, typer.Option("--max-points", help="--search: at most.")] = 14,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write requests.jsonl, summary.json and PNGs here.", metavar="DIR"
        ),
    ] = None,
    as_json: JsonOpt = False,
    predict: Annotated[
        bool, typer.Option("--predict/--no-predict", help="kit/perf's prediction (topology).")
    ] = True,
    label: Annotated[str, typer.Option("--label", help="Name of this run in compare.")] = "",
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs of a --url target (per-GPU compare).")
    ] = None,
    per_gpu: Annotated[bool, typer.Option("--per-gpu", help="compare: rates per GPU.")] = False,
) -> None:
    """Measure goodput: load a deployment at rates, or search the highest rate within its SLO."""
    given = dict(locals())  # every parameter by name, taken before any other local exists
    from kit.bench.compare import compare  # noqa: PLC0415
    from kit.bench.options import BenchArgs, options, target  # noqa: PLC0415
    from kit.bench.run import bench as run_bench  # noqa: PLC0415

    positional = list(targets or [])
    if positional[:1] == ["compare"]:
        compare([Path(p) for p in positional[1:]], out or Path("."), console, per_gpu)
        return
    if len(positional) > 1:
        raise PdkitError(f"one topology at most, got {' '.join(positional)}.")
    plan = resolve_plan(Path(positional[0])) if positional else None
    args = args_from(BenchArgs, given, cli_only=CLI_ONLY)
    chosen = target(args, plan)
    run = options(args, plan)
    if plan is not None:
        from kit.deploy import DeployContext  # noqa: PLC0415
        from kit.deploy.services import local_pids  # noqa: PLC0415

        # The deployment's processes on this machine: bench reports when they saturate a core.
        hosts = DeployContext.build(plan, Path(positional[0])).hosts
        run = replace(run, watch=local_pids(hosts))
    run_bench(chosen, run, err_console if as_json else console, plan)
