"""`pdkit autoscale`: keep the prefill:decode split of a running deployment right as its
workload moves (kit.autoscale)."""

from __future__ import annotations

from typing import Annotated

import typer

from kit.cli.app import app, console
from kit.cli.options import DrainTimeoutOpt, StateDirOpt, TopologyArg


@app.command(
    epilog="Examples:\n\n  pdkit autoscale topologies/local.yaml --dry-run\n\n"
    "  pdkit autoscale topologies/local.yaml --interval 10 --metrics-port 9464\n\n"
    "  pdkit autoscale topologies/local.yaml --once\n\n"
    "Needs the topology's autoscale: section (its bounds, interval, hysteresis, cooldown). "
    "Every interval it logs its decision and the inputs it was made from; `pdkit status` shows "
    "the last one. Instances started with enable-pd-role-switch change role in place "
    "(POST /pd_role_switch), others are drained, stopped and started in the other role."
)
def autoscale(
    topology: TopologyArg,
    *,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Log each decision and its reason; change nothing.")
    ] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            min=0.2,
            help="Seconds between decisions (default: autoscale.interval_s).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Make one decision (two scrapes an interval apart), then exit."
        ),
    ] = False,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve the last decision as Prometheus text on 127.0.0.1:PORT/metrics (0: off).",
        ),
    ] = 0,
    state_dir: StateDirOpt = None,
    drain_timeout: DrainTimeoutOpt = None,
) -> None:
    """Move instances between prefill and decode as the workload moves, within the topology's
    autoscale: bounds."""
    from kit.autoscale.loop import LoopOptions, run  # noqa: PLC0415

    options = LoopOptions(
        interval_s=interval,
        dry_run=dry_run,
        once=once,
        metrics_port=metrics_port,
        state_base=state_dir,
        drain_timeout=drain_timeout,
    )
    raise typer.Exit(run(topology, options, console))
