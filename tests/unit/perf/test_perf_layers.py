"""kit.perf sits below the sim, the planner and the benchmark: it imports only the topology
schema and the error types, never the emulated worker."""

from __future__ import annotations

import ast
from pathlib import Path

import kit.perf

ALLOWED = ("kit.perf", "kit.topology", "kit.errors")


def test_perf_imports_nothing_above_it():
    folder = Path(kit.perf.__file__).parent
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if name.startswith("kit") and not name.startswith(ALLOWED):
                    found[path.name] = name
    assert found == {}
