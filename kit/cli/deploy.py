"""`pdkit up`, `restart`, `down`, `logs`, `provision`, `discover`: what changes the hosts (or
reads them), each through `kit.deploy` with the Plan and its state dir."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, console, err_console, print_warnings, resolve_plan
from kit.cli.options import (
    DrainTimeoutOpt,
    ExtraVarsOpt,
    ForceOpt,
    JsonOpt,
    ParallelOpt,
    StateDirOpt,
    TopologyArg,
    VerboseOpt,
    pair_timeout,
    reference_url,
)
from kit.errors import PdkitError, TopologyError


@app.command(
    epilog="Examples:\n\n  pdkit up topologies/local.yaml\n\n"
    "  pdkit up topologies/llama-8b-1p1d.yaml --timeout 1200\n\n"
    "First checks that every port a host must reach on another host answers (each decode host "
    "to each prefill's bootstrap port, each node to its rank 0's dist-init port). "
    "Runs Ansible (playbooks/deploy.yml) for the workers, waits until every worker answers "
    "/health, then deploys the router and waits for its /readiness; last, the gate sends one "
    "real PD request to every prefill x decode pair (`pdkit doctor`) and fails, naming the pair "
    "and the cause, when one moves no KV. Running it again changes nothing; after a topology "
    "change only the affected processes restart. State (inventory, Ansible output) goes to "
    ".pdkit/<name>/ beside the topology."
)
def up(
    topology: TopologyArg,
    *,
    state_dir: StateDirOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds for every worker to become ready (default: the topology's "
            "cluster.readiness_timeout_s, else 120 for engine sim, 1800 for sglang).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    router_timeout: Annotated[
        float | None,
        typer.Option(
            "--router-timeout",
            help="Seconds for the router to become ready.",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOpt = False,
    no_gate: Annotated[
        bool,
        typer.Option(
            "--no-gate", help="Skip the last stage: one KV transfer per prefill x decode pair."
        ),
    ] = False,
    gate_timeout: Annotated[float | None, pair_timeout("--gate-timeout")] = None,
    gate_reference: Annotated[str | None, reference_url("--gate-reference")] = None,
    diff: Annotated[
        bool,
        typer.Option(
            "--diff", help="Print what would change in the running deployment; change nothing."
        ),
    ] = False,
    parallel: ParallelOpt = 1,
    drain_timeout: DrainTimeoutOpt = None,
    force: ForceOpt = False,
) -> None:
    """Install and start every process of a topology, in order, and wait until it serves."""
    from kit.deploy import DeployContext, UpOptions  # noqa: PLC0415
    from kit.deploy import up as deploy_up  # noqa: PLC0415
    from kit.observe.doctor import DEFAULT_TIMEOUT_S, DoctorOptions  # noqa: PLC0415

    try:
        plan = resolve_plan(topology, state_dir, on_job=False)
    except TopologyError as exc:
        from kit.slurm.scale import no_room  # noqa: PLC0415

        said = no_room(topology, exc)
        if said is exc:
            raise
        raise said from exc
    print_warnings(topology, state_dir)
    options = UpOptions(
        worker_timeout=timeout,
        router_timeout=router_timeout,
        verbose=verbose,
        gate=not no_gate,
        gate_options=DoctorOptions(
            timeout_s=gate_timeout or DEFAULT_TIMEOUT_S, reference_url=gate_reference
        ),
        parallel=parallel,
        drain_timeout=drain_timeout,
        diff_only=diff,
        force=force,
    )
    if plan.slurm is not None:
        from kit.slurm.launcher import up as slurm_up  # noqa: PLC0415

        slurm_up(topology, plan, console, options, state_dir)
        return
    deploy_up(DeployContext.build(plan, topology, state_dir), console, options)


@app.command(
    epilog="Examples:\n\n  pdkit restart topologies/local.yaml decode\n\n"
    "  pdkit restart topologies/local.yaml prefill-1\n\n"
    "  pdkit restart topologies/local.yaml router\n\n"
    "Rolling: one instance at a time (--parallel N: N, keeping one of each role serving) is "
    "taken out of the router and drained, stopped, started, waited for (/health), checked by "
    "the KV transfer gate and put back. All node ranks of a multi-node instance restart "
    "together. A role's only instance: with free GPUs a stand-in (the role's next instance) "
    "starts, is gated and joins first and leaves after; without, requests are held when it is "
    "expected back within router.faults.hold_timeout_s, else the restart refuses, naming the "
    "gap, unless --force. `router` restarts the router, which drains its in-flight requests "
    "first. Refuses when the topology differs from what runs (`pdkit up` applies that)."
)
def restart(
    topology: TopologyArg,
    selector: Annotated[
        str | None,
        typer.Argument(
            help="prefill, decode, router or a process name (default: every worker).",
            show_default=False,
        ),
    ] = None,
    *,
    state_dir: StateDirOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds for each restarted worker to become ready (default: the topology's "
            "cluster.readiness_timeout_s, else 120 for engine sim, 1800 for sglang).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    parallel: ParallelOpt = 1,
    drain_timeout: DrainTimeoutOpt = None,
    no_gate: Annotated[
        bool,
        typer.Option("--no-gate", help="Skip the KV transfer check before each instance rejoins."),
    ] = False,
    force: ForceOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Restart processes one instance at a time without dropping requests: another instance
    of the role serves meanwhile (a role's only one: a stand-in on free GPUs, else the router's
    hold when it restarts within it; else refused without --force)."""
    from kit.deploy import DeployContext, UpOptions  # noqa: PLC0415
    from kit.deploy import restart as deploy_restart  # noqa: PLC0415

    plan = resolve_plan(topology, state_dir)
    options = UpOptions(
        worker_timeout=timeout,
        verbose=verbose,
        gate=not no_gate,
        parallel=parallel,
        drain_timeout=drain_timeout,
        force=force,
    )
    if plan.slurm is not None:
        from kit.slurm.restart import restart as slurm_restart  # noqa: PLC0415

        slurm_restart(topology, plan, console, options, selector=selector, state_base=state_dir)
        return
    deploy_restart(DeployContext.build(plan, topology, state_dir), console, options, selector)


@app.command(
    epilog="Examples:\n\n  pdkit down topologies/local.yaml\n\n"
    "Stops the router first, then the workers (playbooks/down.yml). Logs and configuration "
    "stay on the hosts; running it again is a quiet no-op."
)
def down(
    topology: TopologyArg,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Stop every process of a topology: router first, then workers."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy import down as deploy_down  # noqa: PLC0415

    plan = resolve_plan(topology, state_dir, on_job=False)
    if plan.slurm is not None:
        from kit.slurm.launcher import down as slurm_down  # noqa: PLC0415

        slurm_down(plan, console)
        return
    deploy_down(DeployContext.build(plan, topology, state_dir), console, verbose)


@app.command(
    epilog="Examples:\n\n  pdkit logs topologies/local.yaml\n\n"
    "  pdkit logs topologies/local.yaml decode-0 -n 200\n\n"
    "  pdkit logs topologies/local.yaml prefill -f\n\n"
    "PROCESS is a process name (prefill-0, decode-1-node1, router) or a role (prefill, "
    "decode); without it, every process. Logs live on each host under "
    "<root>/var/log/pdkit/<name>/."
)
def logs(
    topology: TopologyArg,
    process: Annotated[
        str | None,
        typer.Argument(help="Process name or role; default: all.", show_default=False),
    ] = None,
    lines: Annotated[
        int, typer.Option("--lines", "-n", help="Lines from the end of each log.")
    ] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
) -> None:
    """Show the logs of a deployment's processes."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.hosts.logs import show_logs  # noqa: PLC0415

    context = DeployContext.build(resolve_plan(topology), topology)
    selected = [context.log_file(name) for name in context.select_processes(process)]

    def note(text: str) -> None:
        err_console.print(text, markup=False)

    try:
        show_logs(selected, print, note, lines, follow)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command(
    epilog="Examples:\n\n  pdkit provision topologies/llama-8b-1p1d.yaml\n\n"
    "  pdkit provision T --wheelhouse wheelhouse/   (hosts without a package index)\n\n"
    "  pdkit provision T --check   (verify the checklist of docs/provisioning.md, read-only)\n\n"
    "  pdkit provision T --dry-run\n\n"
    "  pdkit provision T --skip nvidia --skip model -e pdkit_base_install_packages=false\n\n"
    "Runs playbooks/provision.yml over the same inventory as `pdkit up`. Roles: base (OS "
    "packages, locked-memory limit, huge pages), nvidia (driver check, persistence mode, fabric "
    "manager), rdma (devices, link state, GID table, GPUDirect RDMA), python (a venv under the "
    "root prefix with SGLang, Mooncake and this pdkit), model (weights). A second run changes "
    "nothing. --transfer-test then moves buffers with the Mooncake transfer engine between "
    "every pair of worker hosts on every rail and prints the bandwidth against the link rate."
)
def provision(
    topology: TopologyArg,
    *,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Verify what every host needs (OS, driver, Python, compilers, ports, packages, "
            "locked memory, NICs, GPUDirect RDMA, the same versions everywhere, the ports other "
            "hosts must reach), read-only; exit 1 when something must be fixed by hand, 2 when "
            "only what provisioning installs is missing.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Report what provisioning would change; change nothing."),
    ] = False,
    wheelhouse: Annotated[
        Path | None,
        typer.Option(
            "--wheelhouse",
            help="Install Python packages only from this folder of wheels (or tar of them), "
            "pushed over SSH; the hosts need no package index.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    index: Annotated[
        bool, typer.Option("--index", help="Hosts install from a package index (default).")
    ] = False,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", help="Leave out a role (repeatable).", metavar="ROLE"),
    ] = None,
    extra_vars: ExtraVarsOpt = None,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
    transfer_test: Annotated[
        bool,
        typer.Option(
            "--transfer-test",
            help="Then test Mooncake transfers between every pair of worker hosts, every rail.",
        ),
    ] = False,
    compile_deep_gemm: Annotated[
        bool,
        typer.Option(
            "--compile-deep-gemm",
            help="FP8 models: compile DeepGEMM's kernels for every single-node worker now "
            "(python -m sglang.compile_deep_gemm with its flags), not at its first start. "
            "The deployment must not be running.",
        ),
    ] = False,
) -> None:
    """Prepare the hosts: packages, limits, GPU and RDMA checks, Python env, model weights."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.hosts.provision import ProvisionOptions, parse_extra_vars  # noqa: PLC0415
    from kit.hosts.provision import provision as run_provision  # noqa: PLC0415

    if index and wheelhouse is not None:
        raise PdkitError("--index and --wheelhouse exclude each other: choose one source.")
    plan = resolve_plan(topology, state_dir, on_job=False)
    if plan.slurm is not None:
        if not check:
            raise PdkitError(
                f"{topology} says launcher: slurm: pdkit does not provision Slurm nodes (the "
                "site does: slurm.venv or slurm.container_image). `pdkit provision "
                f"{topology} --check` says what the nodes lack."
            )
        from kit.slurm.preflight import check as slurm_check  # noqa: PLC0415

        raise typer.Exit(slurm_check(topology, plan, console, state_dir))
    context = DeployContext.build(plan, topology, state_dir)
    if check and (dry_run or transfer_test or compile_deep_gemm or wheelhouse is not None):
        raise PdkitError(
            "--check only reads the hosts: leave out --dry-run, --transfer-test, "
            "--compile-deep-gemm and --wheelhouse."
        )
    if check:
        from kit.hosts.hostcheck import check_hosts  # noqa: PLC0415

        code = check_hosts(context, console, parse_extra_vars(extra_vars or []), verbose=verbose)
        raise typer.Exit(code)
    options = ProvisionOptions(
        dry_run=dry_run,
        wheelhouse=wheelhouse,
        skip=tuple(skip or ()),
        extra_vars=parse_extra_vars(extra_vars or []),
        verbose=verbose,
        transfer_test=transfer_test,
        compile_deep_gemm=compile_deep_gemm,
    )
    run_provision(context, console, options)


@app.command(
    epilog="Examples:\n\n  pdkit discover topologies/qwen3-2p1d-nicmap.yaml\n\n"
    "  pdkit discover lab.yaml --write lab-discovered.yaml\n\n"
    "Runs playbooks/discover.yml (read-only) over the same inventory as `pdkit provision` and "
    "reads each host's GPUs with their NUMA node and PCIe switch, and its RDMA devices with link "
    "layer, state, rate, NUMA node and GID table. Proposes gpus, gpu_type, rdma_devices and a "
    "gpu_nics map (each GPU's NIC: same PCIe switch, else same NUMA node), and a routable RoCE "
    "v2 transfer.gid_index common to the chosen NICs; --write FILE writes the topology with "
    "them, keeping its comments."
)
def discover(
    topology: TopologyArg,
    *,
    write: Annotated[
        Path | None,
        typer.Option(
            "--write",
            help="Write the topology with the proposed fields to FILE.",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    extra_vars: ExtraVarsOpt = None,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Read each host's GPUs, PCIe and NUMA layout and RDMA NICs; propose the NIC fields."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.hosts.discover import DiscoverOptions  # noqa: PLC0415
    from kit.hosts.discover import discover as run_discover  # noqa: PLC0415
    from kit.hosts.provision import parse_extra_vars  # noqa: PLC0415

    options = DiscoverOptions(
        write=write,
        as_json=as_json,
        extra_vars=parse_extra_vars(extra_vars or []),
        verbose=verbose,
    )
    context = DeployContext.build(resolve_plan(topology, state_dir), topology, state_dir)
    run_discover(context, console, options)
