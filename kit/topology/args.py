"""The rules that turn `args:` values into command-line flags, for every process pdkit renders
(SGLang workers, pdkit's router, smg). Pure and deterministic.

Sorted by name; `_` -> `-`; `true` -> bare flag; `false`/`null` -> nothing; a list -> the flag
then each item.

A command is kept as its `Flag`s (each flag with its values) until the argv is written, so
that a later stage (the shell view, `pdkit up`'s diff) reads which values belong to which flag
from the Plan instead of splitting the argv again.
"""

from __future__ import annotations

from collections.abc import Iterable

from kit.topology.schema import ArgValue

Flag = tuple[str, ...]
"""One flag as rendered: its name (`--tp-size`) then its values (`2`); or a word that stands
alone (smg's subcommand `launch`)."""


def normalize_flag(name: str) -> str:
    """'chunked_prefill_size', '--chunked-prefill-size' -> 'chunked-prefill-size'."""
    return name.lstrip("-").replace("_", "-")


def flag_groups(args: dict[str, ArgValue]) -> list[Flag]:
    """Sorted flags, each with its values; see the module docstring for the value rules."""
    out: list[Flag] = []
    for key in sorted(args):
        value = args[key]
        if value is None or value is False:
            continue
        flag = f"--{key}"
        if value is True:
            out.append((flag,))
        elif isinstance(value, list):
            out.append((flag, *(_scalar(v) for v in value)))
        else:
            out.append((flag, _scalar(value)))
    return out


def render_args(args: dict[str, ArgValue]) -> list[str]:
    """`flag_groups` as argv."""
    return list(flatten(flag_groups(args)))


def flatten(flags: Iterable[Flag]) -> tuple[str, ...]:
    """The argv of `flags`, in their order."""
    return tuple(arg for flag in flags for arg in flag)


def _scalar(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
