"""Load a topology file: YAML with positions -> `Topology`, every shape error at once.

This is the only loader. Each error carries the file, line and column of the offending key or
value, its key path, and a fix (for an unknown key: the closest known key).
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kit.errors import Problem, TopologyError
from kit.topology.schema import Topology

Position = tuple[int, int]
KEY_ALIASES = {
    "tp_size": "tp",
    "dp_size": "dp",
    "pp_size": "pp",
    "ep_size": "ep",
    "enable_dp_attention": "dp_attention",
    "attn_dp_size": "dp",
    "instances": "count",
    "replicas": "count",
    "num_gpus": "gpus",
    "ip": "address",
    "api_key": "api_key_env",
}
"""Names users bring from SGLang's flags or other tools -> the topology key to suggest."""
KeyPath = tuple[str | int, ...]


def read_topology_text(path: str | Path) -> str:
    """The file's text, or a `TopologyError` that says why it cannot be read."""
    file = Path(path)
    try:
        return file.read_text()
    except OSError as exc:
        raise TopologyError(
            [Problem((), f"cannot read the file ({exc.strerror}).", "check the path.", str(file))]
        ) from exc


def parse_topology(text: str, file: str = "<topology>") -> tuple[Topology, dict[KeyPath, Position]]:
    """Shape-check YAML text; return the Topology and the position of every key path."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = Problem(
            (),
            f"not valid YAML: {getattr(exc, 'problem', None) or exc}.",
            "fix the YAML syntax at that position.",
            file,
            mark.line + 1 if mark else None,
            mark.column + 1 if mark else None,
        )
        raise TopologyError([problem]) from exc
    if not isinstance(data, dict):
        raise TopologyError(
            [
                Problem(
                    (), "the file must hold a mapping (name:, model:, hosts:, ...).", "", file, 1, 1
                )
            ]
        )
    positions: dict[KeyPath, Position] = {}
    if node is not None:
        _collect_positions(node, (), positions)
    try:
        topology = Topology.model_validate(data)
    except ValidationError as exc:
        problems = [_problem_from_pydantic(err) for err in exc.errors()]
        raise TopologyError([locate(p, positions, file) for p in problems]) from exc
    return topology, positions


def locate(problem: Problem, positions: dict[KeyPath, Position], file: str) -> Problem:
    """Attach the file and the position of the deepest known prefix of the problem's path."""
    path = problem.path
    while path and path not in positions:
        path = path[:-1]
    line, column = positions.get(path, (None, None))
    return Problem(problem.path, problem.message, problem.fix, file, line, column)


def _collect_positions(node: yaml.Node, path: KeyPath, out: dict[KeyPath, Position]) -> None:
    out.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _scalar_key(key_node)
            child = (*path, key)
            # Point at the key itself: that is where the user looks.
            out[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _collect_positions(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_positions(item, (*path, index), out)


def _scalar_key(node: yaml.Node) -> str | int:
    if isinstance(node, yaml.ScalarNode):
        if node.tag == "tag:yaml.org,2002:int":
            try:
                return int(node.value)
            except ValueError:
                return str(node.value)
        return str(node.value)
    return str(node.value)


def _problem_from_pydantic(err: Any) -> Problem:
    loc: KeyPath = tuple(_clean_loc(err["loc"]))
    kind = err["type"]
    if kind == "extra_forbidden":
        unknown = str(loc[-1])
        known = _known_keys(loc[:-1])
        words = known + [alias for alias, key in KEY_ALIASES.items() if key in known]
        close = difflib.get_close_matches(unknown, words, n=1, cutoff=0.6)
        fix = (
            f"Instead of '{unknown}', did you mean '{KEY_ALIASES.get(close[0], close[0])}'?"
            if close
            else f"remove it; known keys here: {', '.join(sorted(known))}."
        )
        return Problem(loc, "unknown key.", fix)
    if kind == "missing":
        return Problem(loc, "required key is missing.", f"add '{loc[-1]}:'.")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    fix = ""
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        fix = f"use one of {expected}."
    elif kind == "string_pattern_mismatch":
        fix = "use lower-case letters, digits, '-', '_' and '.', starting with a letter or digit."
    return Problem(loc, message.rstrip(".") + ".", fix)


def _clean_loc(loc: tuple[Any, ...]) -> list[str | int]:
    """Drop pydantic's union-branch markers (e.g. 'literal[...]', 'tuple[str, ...]')."""
    out: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"}):
            continue
        out.append(part)
    return out


def _known_keys(path: KeyPath) -> list[str]:
    model: Any = Topology
    for part in path:
        model = _unwrap(model)
        if isinstance(part, int):
            continue
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(part)
            if field is None:
                return []
            model = field.annotation
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """tuple[Host, ...], Host | None, Annotated[...] -> Host."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (tuple, list) or origin is types.UnionType or origin is typing.Union:
            models = [
                a
                for a in typing.get_args(annotation)
                if isinstance(a, type) and issubclass(a, BaseModel)
            ]
            if not models:
                return annotation
            annotation = models[0]
        else:
            return annotation
