"""`pdkit size`: prefill:decode counts and parallelism for a model, GPUs, SLO and workload,
searched on kit/perf; `--calibrate` fits that model to a bench run. Each option is a field of
`kit.sizing.command.SizeArgs`, which checks them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, console, err_console
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


@app.command(
    epilog="Examples:\n\n"
    "  pdkit size --model meta-llama/Llama-2-13b-hf --gpu A100-80G --gpus 3 --input-len 512 "
    "--output-len 64 --ttft-ms 400 --tpot-ms 40 --emit out.yaml\n\n"
    "  pdkit size topologies/qwen3-2p1d-nicmap.yaml --input-len lognormal:2048,0.6 "
    "--out runs/size\n\n"
    "  pdkit size --model Qwen/Qwen3-32B --gpu H100-SXM --gpus 64 --target-rate 100\n\n"
    "  pdkit size deployed.yaml --calibrate runs/search\n\n"
    "Searches colocated and PD deployments (prefill and decode counts, TP per role, DP "
    "attention and EP for MoE, decode max-running-requests, colocated chunk size) that SGLang "
    "0.5.23 accepts and whose weights and KV fit, each goodput found in kit/perf's virtual "
    "time with the workload's arrivals and lengths (the same options as pdkit bench). With a "
    "topology its hosts (NIC maps kept), engine, transfer, router and SLO are used and kept in "
    "--emit's file; otherwise --gpus N on hosts of --gpus-per-host. --calibrate fits the "
    "model's efficiency factors to a pdkit bench --out run of TOPOLOGY and stores them "
    "($PDKIT_CALIBRATION, default ~/.config/pdkit/calibration.json) for the next pdkit size.",
)
def size(
    topology: Annotated[
        Path | None,
        typer.Argument(
            help="Topology whose hosts to size for (or, with --calibrate, the one measured).",
            metavar="[TOPOLOGY]",
            show_default=False,
        ),
    ] = None,
    *,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model: HF id, config.json path or shipped name."),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU type, e.g. H100-SXM.")] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="GPUs to size for (generic hosts).")
    ] = None,
    gpus_per_host: Annotated[
        int, typer.Option("--gpus-per-host", min=1, help="GPUs per generic host.")
    ] = 8,
    ttft_ms: TtftOpt = None,
    tpot_ms: TpotOpt = None,
    attainment: AttainmentOpt = None,
    input_len: InputLenOpt = "512",
    output_len: OutputLenOpt = "64",
    arrivals: ArrivalsOpt = "poisson",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Size for a Mooncake-format JSONL trace.")
    ] = None,
    requests: Annotated[
        int, typer.Option("--requests", help="Requests per simulated point (at least).")
    ] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Seed of lengths and arrivals.")] = 0,
    target_rate: Annotated[
        float | None,
        typer.Option("--target-rate", help="Find the fewest GPUs that serve R requests/s."),
    ] = None,
    emit: Annotated[
        Path | None,
        typer.Option(
            "--emit", help="Write the chosen PD deployment as a topology.", metavar="FILE"
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write pareto.png and size.json here.", metavar="DIR"),
    ] = None,
    as_json: JsonOpt = False,
    exhaustive: Annotated[
        bool, typer.Option("--exhaustive", help="Serve every candidate (slow; for checks).")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the table.")] = 10,
    robustness: Annotated[
        bool,
        typer.Option("--robustness/--no-robustness", help="Goodput with lengths x2 and x0.5."),
    ] = True,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            "--calibrate", help="Fit the model to this pdkit bench run.", metavar="RUN_DIR"
        ),
    ] = None,
    use_calibration: Annotated[
        bool,
        typer.Option("--calibration/--no-calibration", help="Use the stored calibration."),
    ] = True,
    prefix_share: Annotated[
        float,
        typer.Option(
            "--prefix-share",
            help="Share of each prompt its group shares: also estimate prefix caching and a "
            "KV pool (kv_pool:) for the chosen deployment.",
        ),
    ] = 0.0,
    prefix_groups: Annotated[
        int, typer.Option("--prefix-groups", help="Groups of prompts with a shared prefix.")
    ] = 0,
) -> None:
    """Choose prefill:decode counts and parallelism for a model, GPUs, SLO and workload."""
    given = dict(locals())  # every parameter by name, taken before any other local exists
    from kit.sizing.command import SizeArgs  # noqa: PLC0415
    from kit.sizing.command import run as run_size  # noqa: PLC0415

    run_size(args_from(SizeArgs, given), err_console if as_json else console)
