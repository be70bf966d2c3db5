"""`pdkit health`, `status`, `doctor`, `trace`, `dashboard`: what a running deployment does,
read from the Plan (probes, the KV transfer matrix, one request's timeline, a Grafana board)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kit.cli.app import app, console, resolve_plan

if TYPE_CHECKING:
    from kit.topology.plan_types import Plan
from kit.cli.options import (
    ConcurrencyOpt,
    JsonOpt,
    ProbeTimeoutOpt,
    StateDirOpt,
    TopologyArg,
    pair_timeout,
    reference_url,
)


@app.command(
    epilog="Examples:\n\n  pdkit health topologies/local.yaml && echo serving\n\n"
    "  pdkit health topologies/local.yaml --json | jq -r '.problems[].line'\n\n"
    "Exit status 0 when every worker and the router are healthy and are what the topology "
    "says, 1 otherwise, with one line per problem and its cause."
)
def health(
    topology: TopologyArg,
    as_json: JsonOpt = False,
    timeout: ProbeTimeoutOpt = 3.0,
    concurrency: ConcurrencyOpt = 128,
) -> None:
    """Probe every worker and the router once, concurrently; list what is wrong."""
    from kit.observe import ProbeOptions  # noqa: PLC0415
    from kit.observe import health as run_health  # noqa: PLC0415

    plan = resolve_plan(topology)
    options = ProbeOptions(timeout_s=timeout, concurrency=concurrency)
    raise typer.Exit(run_health(plan, console, options, as_json))


@app.command(
    epilog="Examples:\n\n  pdkit status topologies/local.yaml\n\n"
    "  pdkit status topologies/local.yaml --watch --interval 5\n\n"
    "  pdkit status topologies/local.yaml --json | jq '.workers[] | {name, state}'\n\n"
    "With --watch --json, one JSON object per line per refresh."
)
def status(
    topology: TopologyArg,
    *,
    as_json: JsonOpt = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes (--watch).")
    ] = 2.0,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many refreshes.")
    ] = None,
    timeout: ProbeTimeoutOpt = 3.0,
    concurrency: ConcurrencyOpt = 128,
    state_dir: StateDirOpt = None,
) -> None:
    """Show every worker per role and the router: state, load, PD queues, KV transfer, SLO,
    and the autoscaler's last decision."""
    from kit.autoscale.record import status_section  # noqa: PLC0415
    from kit.hosts.state_dir import state_dir as deployment_dir  # noqa: PLC0415
    from kit.observe import ProbeOptions  # noqa: PLC0415
    from kit.observe import status as run_status  # noqa: PLC0415

    plan = resolve_plan(topology)
    options = ProbeOptions(timeout_s=timeout, concurrency=concurrency)
    folder = deployment_dir(topology, plan.name, state_dir)
    raise typer.Exit(
        run_status(
            plan,
            console,
            options,
            as_json=as_json,
            watch=watch or count is not None,
            interval_s=interval,
            count=count,
            extra=lambda: _status_extra(plan, status_section(folder)),
        )
    )


def _status_extra(
    plan: Plan, autoscale: tuple[str, dict[str, object]] | None
) -> tuple[str, dict[str, object]] | None:
    """`pdkit status`'s sections below the table: the Slurm job (launcher: slurm), then the
    autoscaler's last decision."""
    lines: list[str] = []
    data: dict[str, object] = {}
    if plan.slurm is not None:
        from kit.slurm.launcher import job_report  # noqa: PLC0415

        report = job_report(plan)
        lines += report
        data["slurm"] = report
    if autoscale is not None:
        lines.append(autoscale[0])
        data["autoscale"] = autoscale[1]
    return ("\n".join(lines), data) if lines else None


@app.command(
    epilog="Examples:\n\n  pdkit doctor topologies/local.yaml\n\n"
    "  pdkit doctor topologies/local.yaml --json | jq '.pairs[] | {prefill, decode, state}'\n\n"
    "Sends one real PD request (a fixed prompt, greedy, 8 output tokens, its own bootstrap "
    "room) straight to every prefill x decode pair, every DP rank included, and prints the "
    "matrix: TTFT and the KV transfer time and speed the prefill reports, or the failure with "
    "its cause from both workers' logs and the fix. Every pair must give the same tokens, and "
    "with --reference URL (a colocated server of the same model) that server's; a pair that "
    "disagrees is named with what it gave. Ends with the model's KV bytes per token and the "
    "transfer time of --input-len tokens at the measured speed, against the TTFT objective. "
    "Exit status 0 when every pair moved KV and gave the expected tokens, 1 otherwise. "
    "`pdkit up` runs the same check last."
)
def doctor(
    topology: TopologyArg,
    *,
    as_json: JsonOpt = False,
    timeout: Annotated[float | None, pair_timeout("--timeout")] = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            min=1,
            help="Pairs in flight per worker (1: each pair's transfer figures are its own).",
        ),
    ] = 1,
    input_len: Annotated[
        int, typer.Option("--input-len", min=1, help="Input tokens for the KV cost line.")
    ] = 2048,
    reference: Annotated[str | None, reference_url("--reference")] = None,
) -> None:
    """Prove KV moves across every prefill x decode pair; name the cause when it does not."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.gate import run_doctor  # noqa: PLC0415
    from kit.observe.doctor import DEFAULT_TIMEOUT_S, DoctorOptions  # noqa: PLC0415

    context = DeployContext.build(resolve_plan(topology), topology)
    options = DoctorOptions(
        timeout_s=timeout or DEFAULT_TIMEOUT_S, parallel=parallel, reference_url=reference
    )
    raise typer.Exit(run_doctor(context, console, options, as_json=as_json, input_tokens=input_len))


@app.command(
    epilog="Examples:\n\n  pdkit dashboard > pd.json\n\n"
    "  pdkit dashboard topologies/local.yaml > pd.json\n\n"
    "Import the file in Grafana (Dashboards > New > Import) and pick the Prometheus that "
    "`monitoring:` deploys. With a topology, the deployment and the SLO thresholds it shows are "
    "the topology's."
)
def dashboard(
    topology: Annotated[
        Path | None,
        typer.Argument(help="Topology YAML file (optional).", metavar="[TOPOLOGY]"),
    ] = None,
) -> None:
    """Print a Grafana dashboard (JSON) of a PD deployment's Prometheus metrics."""
    from kit.observe.dashboard import dashboard_json  # noqa: PLC0415

    sys.stdout.write(dashboard_json(resolve_plan(topology) if topology else None))


@app.command(
    epilog="Examples:\n\n  pdkit trace topologies/local.yaml 5f0c2a9e41d7b3c8\n\n"
    "  pdkit trace topologies/local.yaml 3012580135869468599   (a bootstrap room)\n\n"
    "  pdkit trace topologies/local.yaml runs/local/requests.jsonl   (its slowest request)\n\n"
    "REQUEST is the id the router returns in X-Request-Id (pdkit bench records it as "
    "request_id), the bootstrap room (X-PDKit-Bootstrap-Room), or a bench requests.jsonl. The "
    "router's access log names the prefill, the decode and the room; both workers' logs give "
    "each PD stage. Times are ms from the request's arrival at the router."
)
def trace(
    topology: TopologyArg,
    request: Annotated[
        str,
        typer.Argument(
            help="Request id, bootstrap room, or a bench requests.jsonl.",
            metavar="REQUEST_ID|ROOM|REQUESTS.JSONL",
            show_default=False,
        ),
    ],
) -> None:
    """One request's timeline across router, prefill and decode: each phase and the gaps."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.trace import trace_request  # noqa: PLC0415
    from kit.observe.trace import trace_lines  # noqa: PLC0415

    context = DeployContext.build(resolve_plan(topology), topology)
    for line in trace_lines(trace_request(context, request)):
        console.print(line, markup=False, highlight=False)
