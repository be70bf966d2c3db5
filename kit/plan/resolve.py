"""The one way from a topology file to a Plan: load, place, check everything, build.

    plan = resolve("topologies/local.yaml")   # raises TopologyError with every problem

Every command and every library caller (kit.deploy, kit.observe, kit.bench) goes through
`resolve`, so all get the same checks: the shape, the meaning (GPUs, ports, addresses, NICs),
SGLang's flags and values for the pinned version, and the options of pdkit's router. This
module composes the checks of the layers that own them (`kit.topology` for the meaning,
`kit.sglang` for SGLang, `kit.plan.router` for the values pdkit's router is given). The
topology is placed once and that placement is what validation checks and what the Plan is
built from.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import Problem, TopologyError
from kit.plan.build import build_plan
from kit.plan.launch import launch_problems
from kit.plan.router import router_problems
from kit.sglang.catalog import UnsupportedVersion, load_catalog
from kit.sglang.check import check, deprecations
from kit.topology.facts import (
    DiscoveredFacts,
    fabric_warnings,
    facts_file,
    gid_problems,
    load_facts,
    with_facts,
)
from kit.topology.load import KeyPath, Position, locate, parse_topology, read_topology_text
from kit.topology.place import Placement, placement
from kit.topology.plan_types import Plan
from kit.topology.restarts import only_instance_warnings
from kit.topology.schema import Topology
from kit.topology.validate import validate


def _problems(
    topology: Topology, placed: Placement, facts: DiscoveredFacts | None = None
) -> list[Problem]:
    """Every problem of a topology whose shape is right, placed as `placed`."""
    problems = validate(topology, placed) + launch_problems(topology) + router_problems(topology)
    problems += gid_problems(topology, facts)
    try:
        catalog = load_catalog(topology.sglang_version)
    except UnsupportedVersion as exc:  # one problem, on the key
        problems.append(Problem(("sglang_version",), f"{exc.reason}.", exc.fix))
    else:
        problems += check(topology, catalog)
    return problems


def _warnings(
    topology: Topology, placed: Placement, facts: DiscoveredFacts | None = None
) -> list[Problem]:
    """What still runs but should change: flags SGLang's pinned version deprecates, RDMA NICs
    of unknown link layer, a role's only instance over several nodes whose restart outlasts
    the router's hold."""
    found = fabric_warnings(topology, facts) + only_instance_warnings(topology, placed)
    try:
        catalog = load_catalog(topology.sglang_version)
    except UnsupportedVersion:
        return found  # a problem already
    return found + deprecations(topology, catalog)


def _load(
    path: str | Path, state_base: Path | str | None
) -> tuple[Topology, dict[KeyPath, Position], DiscoveredFacts | None, list[str]]:
    """The topology at `path` with what it leaves out taken from `pdkit discover`'s facts
    (`kit.topology.facts`), its key positions, the facts, and what was taken from them."""
    topology, positions = parse_topology(read_topology_text(path), str(path))
    facts = load_facts(facts_file(Path(path), topology.name, state_base))
    completed, taken = with_facts(topology, facts)
    return completed, positions, facts, taken


def warnings(path: str | Path, state_base: Path | str | None = None) -> list[Problem]:
    """The warnings of the topology at `path`, located and in file order (`pdkit validate`
    prints them; `--strict` makes them problems)."""
    file = str(path)
    topology, positions, facts, _ = _load(path, state_base)
    found = _warnings(topology, placement(topology), facts)
    return _in_file_order([locate(p, positions, file) for p in found])


def _in_file_order(problems: list[Problem]) -> list[Problem]:
    """As a reader goes through the topology; unplaced ones last."""
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, p.column or 0))


def resolve_surge(path: str | Path, role: str, state_base: Path | str | None = None) -> Plan | str:
    """The Plan of the topology at `path` with one more instance of `role` (`pdkit restart`'s
    and `pdkit up`'s surge: a stand-in on free GPUs and ports while the role's only instance is
    replaced), or why there is none: the first problem the extra instance makes (no free GPU,
    a port taken). Placement puts every other instance where it is without the extra one (it is
    placed last of its role; a caller checks that nothing else moved)."""
    topology, _, facts, taken = _load(path, state_base)
    spec = getattr(topology, role)
    grown = topology.model_copy(update={role: spec.model_copy(update={"count": spec.count + 1})})
    placed = placement(grown)
    problems = _problems(grown, placed, facts)
    if not problems:
        return build_plan(grown, Path(path).absolute().parent, placed, taken)
    return problems[0].message.rstrip(".")


def resolve(
    path: str | Path,
    *,
    strict: bool = False,
    sglang_version: str | None = None,
    state_base: Path | str | None = None,
) -> Plan:
    """The Plan of the topology at `path`; `TopologyError` with every problem, each located
    at its file:line:col and listed in file order, when it cannot be deployed. `strict`:
    warnings (`warnings`) are problems too. `sglang_version`: as if the topology pinned that
    version (`pdkit validate --upgrade-to`). `pdkit discover`'s facts, in the state dir
    (`state_base` as `--state-dir` gives it), fill what the topology leaves out; the Plan's
    `discovered` says what.

    Relative paths in the topology (host roots, `router.api_key_file`) are taken from the
    topology file's folder, so every later stage finds the same files wherever pdkit runs."""
    file = str(path)
    topology, positions, facts, taken = _load(path, state_base)
    if sglang_version is not None:
        topology = topology.model_copy(update={"sglang_version": sglang_version})
    placed = placement(topology)
    problems = _problems(topology, placed, facts)
    if strict:
        problems += _warnings(topology, placed, facts)
    if problems:
        raise TopologyError(_in_file_order([locate(p, positions, file) for p in problems]))
    return build_plan(topology, Path(path).absolute().parent, placed, taken)


def resolve_on_nodes(
    path: str | Path, addresses: dict[str, str], state_base: Path | str | None = None
) -> Plan:
    """The Plan of the `launcher: slurm` topology at `path` on the nodes a job got: each host
    (node0, node1, ...) at its address in `addresses` instead of its placeholder, every check
    run again (`resolve`'s errors). Placement does not read addresses, so every process keeps
    its node, GPUs and ports; only what the addresses make (URLs, --host, dist-init, ZMQ
    peers) changes, as the batch script changes it on the nodes."""
    file = str(path)
    topology, positions, facts, taken = _load(path, state_base)
    hosts = tuple(
        h.model_copy(update={"address": addresses.get(h.name, h.address)}) for h in topology.hosts
    )
    topology = topology.model_copy(update={"hosts": hosts})
    placed = placement(topology)
    problems = _problems(topology, placed, facts)
    if problems:
        raise TopologyError(_in_file_order([locate(p, positions, file) for p in problems]))
    return build_plan(topology, Path(path).absolute().parent, placed, taken)
