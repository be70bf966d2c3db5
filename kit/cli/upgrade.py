"""`pdkit upgrade`: a running deployment moved to a new SGLang version, model revision or pdkit
release one instance at a time, each gated, rolled back at the first failed gate
(`kit.deploy.upgrade`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, console, resolve_plan
from kit.cli.options import (
    DrainTimeoutOpt,
    ForceOpt,
    StateDirOpt,
    TopologyArg,
    VerboseOpt,
    pair_timeout,
)
from kit.errors import DeployError


@app.command(
    epilog="Examples:\n\n  pdkit upgrade topologies/local.yaml --to local-0.5.24.yaml --dry-run\n\n"
    "  pdkit upgrade topologies/local.yaml --to local-0.5.24.yaml\n\n"
    "  pdkit upgrade topologies/local.yaml --resume\n\n"
    "TOPOLOGY is the topology that runs; --to's file is a copy of it with what the upgrade "
    "changes: sglang_version and hosts[].sglang_python (an SGLang version), model.revision "
    "(a model revision), or nothing after installing a new pdkit release (its templates and "
    "interpreter). One instance at a time: a role's only instance with a stand-in on a free GPU "
    "first, else within the router's hold (refused, naming the gap, unless --force); every new "
    "instance must give the deployment's own answer to the gate's greedy request from before "
    "the upgrade (or --reference's) before it joins the router. The first that does not stops "
    "the upgrade, and the instances already upgraded are replaced back. Progress is kept in the "
    "state dir (upgrade.json): an interrupted upgrade goes on with --resume or back with "
    "--rollback."
)
def upgrade(
    topology: TopologyArg,
    *,
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            help="The topology to move to (the running one with a new sglang_version, "
            "hosts[].sglang_python or model.revision).",
            metavar="TOPOLOGY",
            show_default=False,
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="URL of a colocated server of the new version (--disaggregation-mode null): "
            "each new instance's tokens must equal its answer, where the new engine's may "
            "differ from the old (default: the deployment's answer before the upgrade).",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List the steps and how long each role runs below its count; change nothing.",
        ),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Go on with an interrupted upgrade.")
    ] = False,
    rollback: Annotated[
        bool,
        typer.Option("--rollback", help="Replace the instances an interrupted upgrade moved back."),
    ] = False,
    state_dir: StateDirOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds for each new instance to become ready (default: the topology's "
            "cluster.readiness_timeout_s, else 120 for engine sim, 1800 for sglang).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    gate_timeout: Annotated[float | None, pair_timeout("--gate-timeout")] = None,
    drain_timeout: DrainTimeoutOpt = None,
    force: ForceOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Move a running deployment to a new SGLang version, model revision or pdkit release,
    one instance at a time, each gated on its tokens; roll back at the first failure."""
    from kit.deploy import DeployContext, UpOptions  # noqa: PLC0415
    from kit.deploy.upgrade import Mode  # noqa: PLC0415
    from kit.deploy.upgrade import upgrade as deploy_upgrade  # noqa: PLC0415
    from kit.observe.doctor import DEFAULT_TIMEOUT_S, DoctorOptions  # noqa: PLC0415

    if resume and rollback:
        raise DeployError("--resume and --rollback exclude each other. To fix: pass one.")
    if reference and (resume or rollback):
        raise DeployError(
            "--reference is kept from the upgrade's start. To fix: leave it out with "
            f"{'--resume' if resume else '--rollback'}."
        )
    plan = resolve_plan(topology, state_dir)
    if plan.slurm is not None:
        raise DeployError(
            "pdkit upgrade runs on launcher: ansible; under launcher: slurm every step of the "
            "job restarts with the allocation. To fix: `pdkit down`, then `pdkit up` the new "
            "topology."
        )
    mode: Mode = "resume" if resume else "rollback" if rollback else "start"
    options = UpOptions(
        worker_timeout=timeout,
        verbose=verbose,
        gate_options=DoctorOptions(timeout_s=gate_timeout or DEFAULT_TIMEOUT_S),
        drain_timeout=drain_timeout,
        force=force,
    )
    deploy_upgrade(
        DeployContext.build(plan, topology, state_dir),
        to,
        console,
        options,
        reference_url=reference,
        dry_run=dry_run,
        mode=mode,
    )
