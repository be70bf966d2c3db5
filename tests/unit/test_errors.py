"""The hierarchy drawn in kit/errors.py is the real one: every PdkitError subclass in kit/ is
drawn there, under its real parent."""

from __future__ import annotations

import importlib
import pkgutil
import re

import kit
from kit import errors
from kit.errors import PdkitError


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_every_pdkit_error_is_drawn_under_its_parent() -> None:
    for info in pkgutil.walk_packages(kit.__path__, "kit."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    lines = (errors.__doc__ or "").splitlines()
    column = {}  # drawn class -> (line, column of its name)
    for row, line in enumerate(lines):
        found = re.match(r"^(\s*(?:[│ ]   )*(?:├── |└── )?)(\w+Error|\w+Version)\b", line)
        if found:
            column[found[2]] = (row, len(found[1]))
    real = {c.__name__: c for c in _subclasses(PdkitError) if c.__module__.startswith("kit.")}
    assert set(real) == set(column) - {"PdkitError"}
    for name, cls in real.items():
        row, col = column[name]
        parent = next(
            drawn
            for drawn, (r, c) in sorted(column.items(), key=lambda x: -x[1][0])
            if r < row and c == col - 4
        )
        assert parent == cls.__bases__[0].__name__, name
