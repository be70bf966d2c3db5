"""A dialect per supported SGLang version, one module each (`v0_5_22.py`, `v0_5_23.py`),
behind one record (`base.Dialect`); the topology's `sglang_version` picks one.

    from kit.sglang.dialects import dialect
    dialect("0.5.22").parallel_flags(dp=8, dp_attention=True)
"""

from __future__ import annotations

from kit.sglang.catalog import UnsupportedVersion, supported_versions
from kit.sglang.dialects import v0_5_22, v0_5_23
from kit.sglang.dialects.base import Dialect, Packages

DIALECTS: dict[str, Dialect] = {d.version: d for d in (v0_5_22.DIALECT, v0_5_23.DIALECT)}


def dialect(version: str) -> Dialect:
    """The dialect of SGLang `version`; `UnsupportedVersion` when pdkit has none."""
    found = DIALECTS.get(version)
    if found is None:
        raise UnsupportedVersion(version, sorted(DIALECTS, key=supported_versions().index))
    return found


__all__ = ["DIALECTS", "Dialect", "Packages", "dialect"]
