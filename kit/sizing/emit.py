"""The answer as a topology: the base topology (hosts with their NIC maps, engine, transfer,
router, ports, args) with its `prefill:` and `decode:` sections and its `slo:` replaced by what
the search chose, written as YAML with comments that say what was chosen and why.

`topology_data` is also how every candidate is written before the validator checks it
(`kit.sizing.accept`), so what was checked is what is emitted. A role's host pins are dropped
(pdkit places the new counts), its ports, bind, env and other args are kept; `pp` is 1.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import yaml

from kit.errors import TopologyError
from kit.sizing.candidates import Deployment, Group
from kit.sizing.problem import SizingError, SizingProblem
from kit.topology.args import normalize_flag

KEPT_ROLE_KEYS = ("port", "bootstrap_port", "dist_init_port", "bind", "env")
WIDTH = 100
"""Columns of the emitted file's comments."""
SEARCHED_FLAGS = ("chunked-prefill-size", "max-running-requests")
"""Args the search sets per role: the base's values are replaced."""


def role_section(base_role: dict[str, Any] | None, group: Group) -> dict[str, Any]:
    """A `prefill:` or `decode:` section for `group`, keeping the base role's ports, bind, env
    and args other than the searched ones."""
    base_role = base_role or {}
    option = group.option
    section: dict[str, Any] = {"count": group.count, "tp": option.tp}
    if option.dp > 1:
        section["dp"] = option.dp
    if option.dp_attention:
        section["dp_attention"] = True
    if option.ep > 1:
        section["ep"] = option.ep
    section.update({k: base_role[k] for k in KEPT_ROLE_KEYS if k in base_role})
    args = {
        k: v
        for k, v in (base_role.get("args") or {}).items()
        if normalize_flag(k) not in SEARCHED_FLAGS
    }
    if option.chunked_prefill_size:
        args["chunked-prefill-size"] = option.chunked_prefill_size
    if option.max_running_requests:
        args["max-running-requests"] = option.max_running_requests
    if args:
        section["args"] = args
    return section


def topology_data(problem: SizingProblem, deployment: Deployment) -> dict[str, Any]:
    """The base topology with `deployment`'s roles and the problem's SLO (a PD deployment)."""
    if deployment.prefill is None or deployment.decode is None:
        raise SizingError(
            "a colocated deployment has no PD topology: pdkit deploys prefill and decode."
        )
    data = copy.deepcopy(problem.base)
    roles = {
        "prefill": role_section(data.get("prefill"), deployment.prefill),
        "decode": role_section(data.get("decode"), deployment.decode),
    }
    # The base's key order; the roles where the base had them, else after hosts/defaults.
    after = "defaults" if "defaults" in data else "hosts"
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("prefill", "decode"):
            out.update(roles)
            roles = {}
        elif key != "slo":
            out[key] = value
        if key == after and "prefill" not in data and "decode" not in data:
            out.update(roles)
            roles = {}
    out.update(roles)
    out["slo"] = problem.slo.model_dump()
    return out


class _Dumper(yaml.SafeDumper):
    """Block style with list items indented under their key, except short lists and GPU ->
    NIC maps on one line."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_list(dumper: yaml.SafeDumper, value: list[Any] | tuple[Any, ...]) -> yaml.Node:
    flat = all(not isinstance(v, dict | list | tuple) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)


def _represent_tuple(dumper: yaml.SafeDumper, value: tuple[Any, ...]) -> yaml.Node:
    return _represent_list(dumper, value)


def _represent_dict(dumper: yaml.SafeDumper, value: dict[Any, Any]) -> yaml.Node:
    nic_map = bool(value) and all(isinstance(k, int) for k in value)
    return dumper.represent_mapping("tag:yaml.org,2002:map", value.items(), flow_style=nic_map)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(tuple, _represent_tuple)
_Dumper.add_representer(dict, _represent_dict)


def comment(lines: list[str]) -> str:
    """`lines` as YAML comments, each paragraph wrapped at `WIDTH`."""
    return "".join(
        f"# {part}".rstrip() + "\n"
        for line in lines
        for part in textwrap.wrap(line, WIDTH - 2, subsequent_indent="  ") or [""]
    )


def render(
    data: dict[str, Any], header: list[str], role_notes: dict[str, list[str]] | None = None
) -> str:
    """YAML text: `header` comment lines on top, `role_notes` above each role's section."""
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    for role, notes in (role_notes or {}).items():
        text = text.replace(f"\n{role}:\n", f"\n{comment(notes)}{role}:\n", 1)
    return comment(header) + text


def write(path: Path, text: str) -> None:
    """Write the topology and check it the way `pdkit validate` does; a topology it refuses
    is a sizing bug, reported with every problem."""
    from kit.plan.resolve import resolve  # noqa: PLC0415 (loads the router's parser)

    try:
        path.write_text(text)
    except OSError as exc:
        raise SizingError(f"--emit {path}: cannot write it ({exc.strerror}).") from exc
    try:
        resolve(path)
    except TopologyError as exc:
        raise SizingError(
            f"the emitted topology {path} does not validate (a pdkit size bug, please report "
            f"it):\n{exc}"
        ) from exc
