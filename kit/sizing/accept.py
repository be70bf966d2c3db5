"""Whether a PD deployment can be deployed: the candidate is written into the base topology
(`kit.sizing.emit.topology_data`) and put through the same checks as `pdkit validate` - pdkit's
placement, GPUs, ports and NICs (`kit.topology.validate`) and SGLang 0.5.23's rules
(`kit.sglang.check`: flags, prefill/decode agreement, the attention-TP mapping the transfer
backend needs, the values the server refuses at start). Only what passes is searched.
"""

from __future__ import annotations

from kit.errors import Problem
from kit.sglang.catalog import UnsupportedVersion, load_catalog
from kit.sglang.check import check
from kit.sizing.candidates import Deployment
from kit.sizing.emit import topology_data
from kit.sizing.problem import SizingError, SizingProblem
from kit.topology.schema import Topology
from kit.topology.validate import validate


def problems(problem: SizingProblem, deployment: Deployment) -> list[Problem]:
    """Every problem `pdkit validate` would report for `deployment` on the problem's hosts
    (empty: it can be deployed)."""
    topology = Topology.model_validate(topology_data(problem, deployment))
    try:
        catalog = load_catalog(topology.sglang_version)
    except UnsupportedVersion as exc:
        raise SizingError(f"sglang_version: {exc.reason}. To fix: {exc.fix}") from exc
    return [*validate(topology), *check(topology, catalog)]


def accepted(problem: SizingProblem, deployment: Deployment) -> bool:
    return not problems(problem, deployment)
