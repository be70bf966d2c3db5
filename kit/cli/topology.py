"""`pdkit validate`, `render`, `schema`: the topology checked, its launch commands, its schema.
None of them touches a host."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from kit.cli.app import app, console, print_warnings, resolve_plan
from kit.cli.options import JsonOpt, StateDirOpt, TopologyArg

UpgradeToOpt = Annotated[
    str | None,
    typer.Option(
        "--upgrade-to",
        help="Also list what changes when the topology moves to this SGLang version "
        "(flags removed, renamed or deprecated, defaults, packages).",
        metavar="VERSION",
        show_default=False,
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Refuse what is only a warning too (flags SGLang deprecates, a role's only "
        "multi-node instance whose restart outlasts the router's hold, ...).",
    ),
]


@app.command(
    epilog="Examples:\n\n  pdkit validate topologies/local.yaml\n\n"
    "  pdkit validate topologies/local.yaml --strict\n\n"
    "Exit status 0 when the topology can be deployed (warnings printed), 1 with every problem "
    "listed otherwise."
)
def validate(
    topology: TopologyArg,
    strict: StrictOpt = False,
    upgrade_to: UpgradeToOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Check a topology completely (shape, GPUs, ports, addresses, SGLang flags), with what
    `pdkit discover`'s facts (in the state dir) fill in."""
    from kit.plan.resolve import resolve  # noqa: PLC0415 (the catalog load is not free)

    plan = resolve(topology, strict=strict, state_base=state_dir)
    print_warnings(topology, state_dir)
    for field in plan.discovered:
        console.print(f"from `pdkit discover`'s facts: {field}", markup=False, highlight=False)
    prefill, decode = plan.role("prefill"), plan.role("decode")
    console.print(
        f"{topology}: OK: {len(prefill)} prefill + {len(decode)} decode instance(s) on "
        f"{len({w.host for w in plan.workers})} host(s), {len(plan.workers)} worker process(es), "
        f"router {plan.router.kind} at {plan.router.url}"
    )
    if upgrade_to is not None:
        _upgrade_report(topology, upgrade_to)


def _upgrade_report(path: Path, version: str) -> None:
    """What moving the topology to SGLang `version` changes; the topology is validated as if
    it pinned `version` first (every problem listed, exit 1)."""
    from kit.plan.resolve import resolve  # noqa: PLC0415
    from kit.sglang.dialects import dialect  # noqa: PLC0415
    from kit.sglang.upgrade import changes  # noqa: PLC0415
    from kit.topology.load import parse_topology, read_topology_text  # noqa: PLC0415

    target = dialect(version)
    resolve(path, sglang_version=version)
    topology, _ = parse_topology(read_topology_text(path), str(path))
    found = changes(topology, target)
    console.print(
        f"upgrade SGLang {topology.sglang_version} -> {version}: "
        f"{len(found)} change(s) for this topology",
        markup=False,
        highlight=False,
    )
    for line in found:
        console.print(f"  - {line}", markup=False, highlight=False)


@app.command(
    epilog="Examples:\n\n  pdkit render topologies/llama-8b-1p1d.yaml\n\n"
    "  pdkit render topologies/local.yaml --json | jq '.workers[].command'\n\n"
    "  pdkit render topologies/local-slurm.yaml > job.sh   (the Slurm batch script)"
)
def render(
    topology: TopologyArg,
    as_json: JsonOpt = False,
    state_dir: StateDirOpt = None,
    launcher: Annotated[
        str | None,
        typer.Option(
            "--launcher",
            help="ansible: the launch lines per host; slurm: the batch script pdkit up "
            "submits (needs launcher: slurm's `slurm:` section). Default: the topology's.",
            metavar="ansible|slurm",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show the exact launch command of every process, per host (or the Plan as JSON, or the
    Slurm batch script)."""
    from kit.errors import PdkitError  # noqa: PLC0415
    from kit.plan.shell import plan_to_shell  # noqa: PLC0415

    plan = resolve_plan(topology, state_dir, on_job=False)
    chosen = launcher or ("slurm" if plan.slurm is not None else "ansible")
    if chosen not in ("ansible", "slurm"):
        raise PdkitError(f"--launcher {chosen}: choose ansible or slurm.")
    if as_json:
        print(plan.model_dump_json(indent=2))
    elif chosen == "slurm":
        from kit.slurm.script import batch_script  # noqa: PLC0415

        if plan.slurm is None:
            raise PdkitError(
                f"--launcher slurm: {topology} has no `slurm:` section; set launcher: slurm "
                "and slurm: (nodes, gpus_per_node, ...) in it (docs/slurm.md)."
            )
        sys.stdout.write(batch_script(plan))
    else:
        sys.stdout.write(plan_to_shell(plan))


@app.command(epilog="Example:\n\n  pdkit schema > topology.schema.json")
def schema() -> None:
    """Print the JSON Schema of the topology file (for editors and linters)."""
    from kit.topology.schema import Topology  # noqa: PLC0415

    print(json.dumps(Topology.model_json_schema(), indent=2, sort_keys=True))
