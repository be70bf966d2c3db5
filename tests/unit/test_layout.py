"""The folders keep their roles, read from the import statements (ast, nothing is imported):
kit is the package and imports none of the folders around it; tests and tools never import each
other; benchmarks may import the tests' support but no test imports a benchmark."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

TOP_LEVEL = ("kit", "tests", "tools", "benchmarks")
FORBIDDEN = {
    "kit": ("tests", "tools", "benchmarks"),
    "tests": ("tools", "benchmarks"),
    "tools": ("tests", "benchmarks"),
    "benchmarks": ("tools",),
}
"""For each folder, the top-level folders whose modules it must not import."""


@functools.cache
def tree(path: Path) -> ast.Module:
    """The parsed module (each file parsed once for all the tests here)."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def imported_modules(path: Path) -> frozenset[str]:
    """Every absolute module name that `path` imports, at module level or inside a function."""
    names: set[str] = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return frozenset(names)


def imports_from(folder: str) -> list[tuple[str, str]]:
    """(file, module) for every import in the Python files under `folder`."""
    return [
        (str(path.relative_to(REPO)), module)
        for path in sorted((REPO / folder).rglob("*.py"))
        for module in sorted(imported_modules(path))
    ]


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


@pytest.mark.parametrize("folder", TOP_LEVEL)
def test_no_folder_imports_one_it_must_not(folder):
    found = [(f, m) for f, m in imports_from(folder) if under(m, *FORBIDDEN[folder])]
    assert found == [], f"{folder}/ must not import {FORBIDDEN[folder]}"


def test_benchmarks_import_only_the_tests_support():
    found = [(f, m) for f, m in imports_from("benchmarks") if under(m, "tests")]
    found = [(f, m) for f, m in found if not under(m, "tests.support")]
    assert found == [], "benchmarks/ may import tests.support, no other part of tests/"


@pytest.mark.parametrize("folder", ["tests/support", "tests/oracles"])
def test_the_shared_test_code_imports_no_test_module(folder):
    found = [(f, m) for f, m in imports_from(folder) if under(m, "tests.unit", "tests.e2e")]
    assert found == [], f"{folder}/ is shared: move what it needs out of the test module into it"


SHARED_TEST_CODE = ("tests.support", "tests.oracles", "tests.conftest")
"""What a test may import from tests/: the helpers, the oracles and the root conftest's paths and
builders. A test module or a folder's conftest imported by another file runs its module code
twice (pytest imports it under its own name too) and hides which helpers are shared."""


def test_tests_import_only_the_shared_test_code():
    found = [(f, m) for f, m in imports_from("tests") if under(m, "tests")]
    found = [(f, m) for f, m in found if not under(m, *SHARED_TEST_CODE)]
    assert found == [], f"move what tests share into {SHARED_TEST_CODE[:2]}"


def test_the_folders_give_the_environment_markers():
    """tests/conftest.py marks a test by its folder (e2e/, e2e/sglang/, e2e/real_sglang/,
    e2e/multihost/): a module that marks itself escapes a folder's grouping and `make test`'s
    passes (the real engine's tests run alone)."""
    marked = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if re.search(r"mark\.(e2e|sglang|real_sglang|netns)\b", path.read_text())
    ]
    assert marked == [], "move the module into the folder of its environment"


def test_the_test_folders_hold_only_tests_and_their_fixtures():
    helpers = [
        str(path.relative_to(REPO))
        for folder in ("tests/unit", "tests/e2e")
        for path in sorted((REPO / folder).rglob("*.py"))
        if not path.name.startswith("test_") and path.name not in ("conftest.py", "__init__.py")
    ]
    assert helpers == [], "helpers live in tests/support (fixtures in a conftest.py)"


def test_no_relative_import_hides_a_crossing():
    relative = [
        str(path.relative_to(REPO))
        for folder in TOP_LEVEL
        for path in sorted((REPO / folder).rglob("*.py"))
        for node in ast.walk(tree(path))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == []


def test_the_walk_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tools.gen_catalog import main\n    import tests.x\n")
    assert imported_modules(module) == {"tools.gen_catalog", "tests.x"}


LAYER_ORDER: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("autoscale", "slurm"),
    ("deploy",),
    ("hosts",),
    ("sizing",),
    ("bench", "plan"),
    ("lb", "observe", "ranks", "sglang", "sim"),
    ("kvevents", "perf"),
    ("topology",),
    ("aio", "byte_tokenizer", "net", "secrets", "token_check"),
    ("errors",),
)
"""kit's layers, top to bottom, as docs/development.md draws them: each package and each module
of kit/ itself imports only from layers below its own, never sideways or up."""

KIT_LAYERS: dict[str, set[str]] = {
    # The base: modules of kit/ itself (errors, net, secrets, aio, byte_tokenizer, token_check)
    # and the schema floor.
    "topology": {"errors", "net", "secrets"},
    "kvevents": set(),
    "perf": {"errors", "topology"},
    "sglang": {"errors", "net", "topology"},
    "lb": {
        "aio",
        "byte_tokenizer",
        "errors",
        "kvevents",
        "net",
        "secrets",
        "token_check",
        "topology",
    },
    "sim": {"aio", "byte_tokenizer", "errors", "kvevents", "net", "perf", "topology"},
    "ranks": {"net"},
    "plan": {"errors", "net", "sglang", "topology"},
    "observe": {"errors", "net", "perf", "token_check", "topology"},
    "bench": {"aio", "byte_tokenizer", "errors", "net", "perf", "secrets", "topology"},
    "sizing": {"bench", "errors", "perf", "plan", "sglang", "topology"},
    "hosts": {"errors", "perf", "plan", "topology"},
    "deploy": {"errors", "hosts", "net", "observe", "perf", "plan", "secrets", "topology"},
    "slurm": {"deploy", "errors", "hosts", "net", "observe", "plan", "secrets", "topology"},
    "autoscale": {
        "bench",
        "deploy",
        "errors",
        "hosts",
        "net",
        "observe",
        "perf",
        "plan",
        "sizing",
        "topology",
    },
}
"""What each package of kit/ may import from the rest of kit/ (docs/development.md's layers:
the Plan is assembled in kit/plan above kit/sglang, and renders the router's command from the
options table in kit/topology without importing the router's runtime, kit/lb; kit/deploy stands
on kit/hosts; kit/topology imports nothing above it; only kit/cli imports everything)."""

EMULATOR_USERS = {"cli"}
"""The packages that may import kit/sim: the bench and the Plan do not know the emulator."""

MAX_MODULE_LINES = 700
LONG_MODULES_ALLOWED = ("kit/sglang/startup/",)
"""Generated and rule tables, one row per SGLang refusal."""


def kit_unit(path: Path) -> str:
    """The layer unit of a file of kit/: its package (kit/lb/x.py -> lb) or its own module
    (kit/net.py -> net)."""
    parts = path.relative_to(REPO / "kit").parts
    return parts[0] if len(parts) > 1 else path.stem


@functools.cache
def kit_imports() -> list[tuple[str, str, str]]:
    """(file, its unit, the unit it imports) for every import of kit/ by kit/ across units."""
    found = []
    for path in sorted((REPO / "kit").rglob("*.py")):
        if path == REPO / "kit" / "__init__.py":
            continue
        source = kit_unit(path)
        for node in ast.walk(tree(path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "kit":  # from kit import errors
                    targets = [f"kit.{a.name}" for a in node.names]
                else:
                    targets = [node.module]
            for target in targets:
                unit = target.split(".")[1] if under(target, "kit") and "." in target else ""
                if unit and unit != source:
                    found.append((str(path.relative_to(REPO)), source, unit))
    return found


def layer_rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYER_ORDER) if unit in layer)


def test_every_unit_of_kit_has_its_layer():
    units = {kit_unit(p) for p in (REPO / "kit").rglob("*.py")} - {"__init__"}
    placed = {unit for layer in LAYER_ORDER for unit in layer}
    assert sorted(units - placed) == [], "add it to LAYER_ORDER and docs/development.md"
    assert sorted(placed - units) == []


def test_no_import_runs_back_up():
    up = [
        (file, target)
        for file, source, target in kit_imports()
        if layer_rank(target) <= layer_rank(source)
    ]
    assert up == [], "an import of kit/ runs sideways or up LAYER_ORDER"


def test_no_import_circle_between_kit_packages():
    graph: dict[str, set[str]] = {}
    for _, source, target in kit_imports():
        graph.setdefault(source, set()).add(target)

    def circle_from(start: str) -> list[str]:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            unit, path = stack.pop()
            for below in sorted(graph.get(unit, set())):
                if below == start:
                    return [*path, start]
                if below not in seen:
                    seen.add(below)
                    stack.append((below, [*path, below]))
        return []

    circles = [c for unit in sorted(graph) if (c := circle_from(unit))]
    assert circles == []


def test_the_declared_layers_follow_the_layer_order():
    sideways = [
        (package, below)
        for package, allowed in KIT_LAYERS.items()
        for below in allowed
        if layer_rank(below) <= layer_rank(package)
    ]
    assert sideways == []


def test_only_the_cli_imports_the_emulator():
    found = [
        (file, source)
        for file, source, target in kit_imports()
        if target == "sim" and source not in EMULATOR_USERS
    ]
    assert found == [], "the bench and the Plan (and all but the CLI) do not know the emulator"
    assert "sim" not in KIT_LAYERS["bench"] and "sim" not in KIT_LAYERS["plan"]


def test_hosts_import_nothing_of_deploy():
    found = [(f, s) for f, s, t in kit_imports() if s == "hosts" and t == "deploy"]
    assert found == [], "kit/deploy stands on kit/hosts, never the other way"


def long_modules() -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "kit").rglob("*.py")
        if not str(path.relative_to(REPO)).startswith(LONG_MODULES_ALLOWED)
        and len(path.read_text().splitlines()) > MAX_MODULE_LINES
    )


def test_no_kit_module_is_over_700_lines():
    assert long_modules() == []


@pytest.mark.parametrize("package", sorted(KIT_LAYERS))
def test_each_kit_package_imports_only_the_layers_below_it(package):
    found = sorted(
        (str(path.relative_to(REPO)), module)
        for path in (REPO / "kit" / package).rglob("*.py")
        for module in imported_modules(path)
        if under(module, "kit")
        and module.split(".")[1] != package
        and module.split(".")[1] not in KIT_LAYERS[package]
    )
    assert found == [], f"kit/{package} imports above its layer"


def test_the_kit_layers_have_no_circle():
    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for below in KIT_LAYERS.get(start, set()):
            if below == goal or (below not in seen and reaches(below, goal, seen | {below})):
                return True
        return False

    assert [p for p in KIT_LAYERS if reaches(p, p, set())] == []
