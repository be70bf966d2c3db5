"""The `pdkit` typer app, its consoles and `main()`: `PdkitError` is caught once here and
printed without a traceback (`--debug` shows it)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from kit.errors import PdkitError

if TYPE_CHECKING:
    from kit.topology.plan_types import Plan

app = typer.Typer(
    name="pdkit",
    help=(
        "Deploy SGLang with prefill/decode disaggregation on bare-metal GPU hosts.\n\n"
        "Examples:\n\n"
        "  pdkit validate topologies/local.yaml\n\n"
        "  pdkit render topologies/llama-8b-1p1d.yaml\n\n"
        "  pdkit up topologies/local.yaml\n\n"
        "  pdkit status topologies/local.yaml --watch"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"debug": False}


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    _state["debug"] = debug


def resolve_plan(topology: Path, state_base: Path | None = None, *, on_job: bool = True) -> Plan:
    """The topology's Plan, every check run (`kit.plan.resolve`), with `pdkit discover`'s
    facts from the state dir (`state_base`: --state-dir). For `launcher: slurm`, on the nodes
    of the deployment's recorded job (`on_job`), else with placeholder addresses."""
    from kit.plan.resolve import resolve  # noqa: PLC0415 (the catalog load is not free)

    plan = resolve(topology, state_base=state_base)
    if plan.slurm is None or not on_job:
        return plan
    from kit.slurm.launcher import plan_on_job  # noqa: PLC0415

    return plan_on_job(topology, plan, state_base)


def print_warnings(topology: Path, state_base: Path | None = None) -> None:
    """The topology's warnings (`kit.plan.resolve.warnings`: what still runs but should change),
    one `warning:` line each on stderr: `pdkit validate` and `pdkit up` print them."""
    from kit.plan.resolve import warnings  # noqa: PLC0415

    for warning in warnings(topology, state_base):
        err_console.print(f"warning: {warning}", markup=False, highlight=False)


def order_commands(names: tuple[str, ...]) -> None:
    """List the commands in `pdkit --help` in this order, whatever module defines each."""
    rank = {name: i for i, name in enumerate(names)}
    defined = [getattr(c.callback, "__name__", "") for c in app.registered_commands]
    unranked = sorted(set(defined) - set(rank))
    if unranked:
        raise TypeError(f"commands missing from the order of `pdkit --help`: {unranked}")
    app.registered_commands.sort(key=lambda c: rank[getattr(c.callback, "__name__", "")])


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except PdkitError as exc:
        if _state["debug"]:
            raise
        err_console.print(str(exc), markup=False)
        sys.exit(1)
    finally:
        # The command is over, its output written and its exit status decided. Python's
        # shutdown sets a signal with a Python handler back to its default, so a Ctrl-C from
        # here on (a script stopping `pdkit bench` just as it ends) would only turn that status
        # into death by SIGINT; an ignored signal stays ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
