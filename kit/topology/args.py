"""The rules that turn `args:` values into command-line flags, for every process pdkit renders
(SGLang workers, pdkit's router, smg). Pure and deterministic.

Sorted by name; `_` -> `-`; `true` -> bare flag; `false`/`null` -> nothing; a list -> the flag
then each item.
"""

from __future__ import annotations

from kit.topology.schema import ArgValue


def normalize_flag(name: str) -> str:
    """'chunked_prefill_size', '--chunked-prefill-size' -> 'chunked-prefill-size'."""
    return name.lstrip("-").replace("_", "-")


def render_args(args: dict[str, ArgValue]) -> list[str]:
    """Sorted flags; see the module docstring for the value rules."""
    out: list[str] = []
    for key in sorted(args):
        value = args[key]
        if value is None or value is False:
            continue
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            out += [flag, *(_scalar(v) for v in value)]
        else:
            out += [flag, _scalar(value)]
    return out


def _scalar(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
