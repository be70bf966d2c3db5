"""`pdkit lb`: pdkit's PD load balancer in the foreground, its options those of `python -m kit.lb`
(passed through untouched), its workers optionally taken from a topology."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, resolve_plan
from kit.errors import PdkitError


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    epilog="Examples:\n\n"
    "  pdkit lb --prefill http://10.0.0.1:30000 8998 --decode http://10.0.0.2:30001 --port 8000\n\n"
    "  pdkit lb --topology topologies/local.yaml\n\n"
    "  pdkit lb --help   (every option)",
)
def lb(
    ctx: typer.Context,
    topology: Annotated[
        Path | None,
        typer.Option("--topology", help="Take workers, policies and port from this topology."),
    ] = None,
) -> None:
    """Run pdkit's PD load balancer in the foreground (options as `python -m kit.lb`)."""
    from kit.lb import main as lb_main  # noqa: PLC0415

    argv = list(ctx.args)
    if topology is not None:
        router = resolve_plan(topology).router
        if router.kind != "pdkit":
            raise PdkitError(
                f"{topology}: router.kind is {router.kind}; `pdkit lb` runs pdkit's router. "
                "To fix: set router.kind: pdkit, or run that router instead."
            )
        argv = [*router.command.args, *argv]
    raise typer.Exit(lb_main(argv))
