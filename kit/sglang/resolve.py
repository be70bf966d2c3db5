"""The one way from a topology file to a Plan: load, check everything, render."""

from __future__ import annotations

from pathlib import Path

from kit.errors import Problem, RenderError, TopologyError
from kit.sglang.catalog import load_catalog
from kit.sglang.check import check
from kit.sglang.render import build_plan
from kit.topology.load import locate, parse_topology, read_topology_text
from kit.topology.plan import Plan
from kit.topology.schema import Topology
from kit.topology.validate import validate


def check_topology(path: str | Path) -> Topology:
    """Load and check the topology at `path`; raise `TopologyError` with every problem."""
    file = str(path)
    topology, positions = parse_topology(read_topology_text(path), file)
    problems: list[Problem] = validate(topology)
    try:
        catalog = load_catalog(topology.sglang_version)
    except RenderError as exc:  # no catalog for that version: one problem, on the key
        problems.append(
            Problem(
                ("sglang_version",),
                str(exc).split(" To fix: ")[0].rstrip("."),
                "use a version pdkit ships a flag catalog for.",
            )
        )
    else:
        problems += check(topology, catalog)
    if problems:
        located = [locate(p, positions, file) for p in problems]
        # In file order, as a reader goes through the topology; unplaced ones last.
        located.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        raise TopologyError(located)
    return topology


def resolve(path: str | Path) -> Plan:
    """The Plan of the topology at `path` (raises `TopologyError` when it has problems).

    Paths in the topology are taken from the topology file's folder: a relative
    `router.api_key_file` is made absolute here, so every later stage reads the same file
    wherever pdkit runs from."""
    plan = build_plan(check_topology(path))
    key_file = plan.router.api_key_file
    if key_file and not Path(key_file).expanduser().is_absolute():
        absolute = str(Path(path).absolute().parent / Path(key_file).expanduser())
        plan = plan.model_copy(
            update={"router": plan.router.model_copy(update={"api_key_file": absolute})}
        )
    return plan
