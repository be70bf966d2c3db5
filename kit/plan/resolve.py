"""The one way from a topology file to a Plan: load, place, check everything, build.

    plan = resolve("topologies/local.yaml")   # raises TopologyError with every problem

Every command and every library caller (kit.deploy, kit.observe, kit.bench) goes through
`resolve`, so all get the same checks: the shape, the meaning (GPUs, ports, addresses, NICs),
SGLang's flags and values for the pinned version, and the options of pdkit's router. This
module composes the checks of the layers that own them (`kit.topology` for the meaning,
`kit.sglang` for SGLang, `kit.lb` for the router's command line). The topology is placed once
and that placement is what validation checks and what the Plan is built from.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import Problem, TopologyError
from kit.lb.config import argv_problem
from kit.plan.build import build_plan
from kit.plan.launch import launch_problems
from kit.sglang.catalog import UnsupportedVersion, load_catalog
from kit.sglang.check import check
from kit.topology.load import locate, parse_topology, read_topology_text
from kit.topology.place import Placement, placement
from kit.topology.plan_types import Plan
from kit.topology.schema import Topology
from kit.topology.validate import validate


def _problems(topology: Topology, placed: Placement) -> list[Problem]:
    """Every problem of a topology whose shape is right, placed as `placed`."""
    problems = validate(topology, placed) + launch_problems(topology)
    try:
        catalog = load_catalog(topology.sglang_version)
    except UnsupportedVersion as exc:  # one problem, on the key
        problems.append(Problem(("sglang_version",), f"{exc.reason}.", exc.fix))
    else:
        problems += check(topology, catalog)
    return problems


def _router_problems(plan: Plan) -> list[Problem]:
    """The pdkit router's own parser on the command line the Plan gives it (router.args)."""
    if plan.router.kind != "pdkit":
        return []
    problem = argv_problem(plan.router.command.args)
    if problem is None:
        return []
    return [
        Problem(
            ("router", "args"),
            f"pdkit's router would refuse its options: {problem}.",
            "fix router.args (every option: `pdkit lb --help`).",
        )
    ]


def resolve_surge(path: str | Path, role: str) -> Plan | str:
    """The Plan of the topology at `path` with one more instance of `role` (`pdkit restart`'s
    and `pdkit up`'s surge: a stand-in on free GPUs and ports while the role's only instance is
    replaced), or why there is none: the first problem the extra instance makes (no free GPU,
    a port taken). Placement puts every other instance where it is without the extra one (it is
    placed last of its role; a caller checks that nothing else moved)."""
    file = str(path)
    topology, _ = parse_topology(read_topology_text(path), file)
    spec = getattr(topology, role)
    grown = topology.model_copy(update={role: spec.model_copy(update={"count": spec.count + 1})})
    placed = placement(grown)
    problems = _problems(grown, placed)
    if not problems:
        plan = build_plan(grown, Path(path).absolute().parent, placed)
        problems = _router_problems(plan)
        if not problems:
            return plan
    return problems[0].message.rstrip(".")


def resolve(path: str | Path) -> Plan:
    """The Plan of the topology at `path`; `TopologyError` with every problem, each located
    at its file:line:col and listed in file order, when it cannot be deployed.

    Relative paths in the topology (host roots, `router.api_key_file`) are taken from the
    topology file's folder, so every later stage finds the same files wherever pdkit runs."""
    file = str(path)
    topology, positions = parse_topology(read_topology_text(path), file)
    placed = placement(topology)
    problems = _problems(topology, placed)
    plan = None
    if not problems:
        plan = build_plan(topology, Path(path).absolute().parent, placed)
        problems = _router_problems(plan)
    if problems or plan is None:
        located = [locate(p, positions, file) for p in problems]
        # In file order, as a reader goes through the topology; unplaced ones last.
        located.sort(key=lambda p: (p.line is None, p.line or 0, p.column or 0))
        raise TopologyError(located)
    return plan
