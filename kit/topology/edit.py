"""Set fields of a topology file's text and keep everything else, comments included.

PyYAML drops comments when it loads, and no comment-keeping YAML library is a dependency, so
this edits the text: PyYAML's composer gives the position of every node, and each value is
replaced in place (flow style: `[mlx5_0, mlx5_1]`, `{0: mlx5_0}`), or a missing key is added
after the last key of its mapping, at that mapping's indentation (or before the closing brace of
a flow mapping `{name: a, ...}`). Only the replaced values change; comments inside a replaced
block value (between its items) go with it. The result is checked by loading it again.

    edit_topology(text, {"gpu-a": {"gpus": 8, "gpu_nics": {0: "mlx5_0"}}}, {"gid_index": 3})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

HostFields = dict[str, Any]
Edit = tuple[int, int, str]  # replace text[start:end] with the string


class EditError(ValueError):
    """The topology text cannot be edited as asked (its shape is not a topology's)."""


def _flow(value: Any) -> str:
    """`value` as one line of flow YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _end(node: Node) -> int:
    """Where a value really ends: a block collection's end mark lies past trailing comments
    and blank lines, so take its last leaf's end instead."""
    if isinstance(node, MappingNode | SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        return _end(last[1] if isinstance(node, MappingNode) else last)
    return int(node.end_mark.index)


def _key(mapping: MappingNode, name: str) -> tuple[ScalarNode, Node] | None:
    for key, value in mapping.value:
        if isinstance(key, ScalarNode) and key.value == name:
            return key, value
    return None


def _set(text: str, mapping: MappingNode, fields: Mapping[str, Any]) -> list[Edit]:
    """Edits that set `fields` in `mapping` (replace the value, or add the key)."""
    edits: list[Edit] = []
    added: list[str] = []
    for name, value in fields.items():
        found = _key(mapping, name)
        if found is not None:
            node = found[1]
            edits.append((node.start_mark.index, _end(node), _flow(value)))
        else:
            added.append(f"{name}: {_flow(value)}")
    if not added:
        return edits
    if mapping.flow_style:
        close = text.rindex("}", mapping.start_mark.index, mapping.end_mark.index)
        edits.append((close, close, "".join(f", {item}" for item in added)))
        return edits
    if not mapping.value:
        raise EditError("an empty block mapping cannot take new keys")
    indent = " " * mapping.value[0][0].start_mark.column
    line_end = text.find("\n", _end(mapping.value[-1][1]))
    at = len(text) if line_end < 0 else line_end
    edits.append((at, at, "".join(f"\n{indent}{item}" for item in added)))
    return edits


def edit_topology(
    text: str, hosts: Mapping[str, HostFields], transfer: Mapping[str, Any] | None = None
) -> str:
    """`text` with each named host's fields and the `transfer` fields set (see the module
    doc). Raises `EditError` when a host is not in the file or the result does not load."""
    root = yaml.compose(text)
    if not isinstance(root, MappingNode):
        raise EditError("the topology is not a YAML mapping")
    edits: list[Edit] = []
    found = _key(root, "hosts")
    if hosts and (found is None or not isinstance(found[1], SequenceNode)):
        raise EditError("the topology has no hosts: list")
    by_name: dict[str, MappingNode] = {}
    for item in found[1].value if found else []:
        name = _key(item, "name") if isinstance(item, MappingNode) else None
        if name is not None and isinstance(item, MappingNode):
            by_name[str(name[1].value)] = item
    for host, fields in hosts.items():
        if host not in by_name:
            raise EditError(f"host {host!r} is not in the topology's hosts")
        edits += _set(text, by_name[host], fields)
    if transfer:
        section = _key(root, "transfer")
        if section is not None and isinstance(section[1], MappingNode) and section[1].value:
            edits += _set(text, section[1], transfer)
        elif section is not None:
            node = section[1]
            edits.append((node.start_mark.index, _end(node), _flow(dict(transfer))))
        else:
            tail = "" if text.endswith("\n") or not text else "\n"
            lines = "".join(f"  {k}: {_flow(v)}\n" for k, v in transfer.items())
            edits.append((len(text), len(text), f"{tail}transfer:\n{lines}"))
    out = text
    for start, end, new in sorted(edits, key=lambda e: e[0], reverse=True):
        out = out[:start] + new + out[end:]
    _check(out, hosts, transfer or {})
    return out


def _check(text: str, hosts: Mapping[str, HostFields], transfer: Mapping[str, Any]) -> None:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # a bug here, never the user's: say so plainly
        raise EditError(f"the edited topology does not parse: {exc}") from exc
    got = {h["name"]: h for h in data.get("hosts", []) if isinstance(h, dict)}
    for host, fields in hosts.items():
        for key, value in fields.items():
            if got[host].get(key) != value:
                raise EditError(f"hosts[{host}].{key} did not take {value!r}")
    for key, value in transfer.items():
        if (data.get("transfer") or {}).get(key) != value:
            raise EditError(f"transfer.{key} did not take {value!r}")
