"""What changes for one topology when it moves from its SGLang version to another
(`pdkit validate T --upgrade-to VERSION`; `pdkit upgrade` reads the same list).

    changes(topology, dialect("0.5.23"))   # ["decode.args.disable-cuda-graph: deprecated ...", ...]

In order: the topology's own flags that the target removes, deprecates or refuses the value
of; pdkit's rendered flags whose spelling changes; defaults that change under flags the
topology leaves unset; the packages provisioning installs.
"""

from __future__ import annotations

from kit.sglang.dialects import Dialect, dialect
from kit.topology.schema import ROLE_NAMES, ArgValue, Topology


def _scopes(topology: Topology) -> list[tuple[str, dict[str, ArgValue]]]:
    scopes: list[tuple[str, dict[str, ArgValue]]] = [("defaults", topology.defaults.args)]
    return scopes + [(role, getattr(topology, role).args) for role in ROLE_NAMES]


def changes(topology: Topology, target: Dialect) -> list[str]:
    """One line per change the move from `topology.sglang_version` to `target` makes."""
    source = dialect(topology.sglang_version)
    old, new = source.catalog, target.catalog
    lines: list[str] = []
    set_flags: set[str] = set()
    for scope, args in _scopes(topology):
        for key, value in args.items():
            where = f"{scope}.args.{key}"
            spec = new.lookup(key)
            before = old.lookup(key)
            if before is not None:
                set_flags.add(before.flag)
            if spec is None:
                lines.append(f"{where}: removed in SGLang {target.version}; remove it.")
                continue
            if (
                spec.deprecated
                and value not in (None, False)
                and not (before and before.deprecated)
            ):
                use = f"; use {spec.replacement}" if spec.replacement else ""
                lines.append(f"{where}: deprecated in SGLang {target.version}{use}.")
            error = new.check_value(spec, value)
            if error:
                lines.append(f"{where}: {spec.flag} {error} in SGLang {target.version}.")
    for name, b in target.spellings.items():
        a = source.spellings.get(name)
        if a != b:
            lines.append(f"pdkit renders {b} instead of {a}." if a else f"pdkit renders {b}.")
    for spec in new:
        was = old.flags.get(spec.flag)
        if was is None or spec.flag in set_flags or was.default == spec.default:
            continue
        lines.append(f"{spec.flag}: default {was.default!r} -> {spec.default!r} (not set here).")
    lines += [f"note: {note}" for note in target.notes if target.version != source.version]
    before_pk, after_pk = source.packages.as_dict(), target.packages.as_dict()
    for name, value in after_pk.items():
        if before_pk[name] != value:
            lines.append(f"provisioning: {name} {before_pk[name]} -> {value}.")
    return lines


__all__ = ["changes"]
