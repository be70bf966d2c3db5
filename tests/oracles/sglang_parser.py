"""Ask SGLang's own parser about launch arguments, from tests running in the pdkit venv.

SGLang lives in its own venv (`.venv-sglang`, see the Makefile) so that torch never enters
pdkit's. `parse_with_sglang` runs `tests/oracles/sglang_parse.py` there, once for a whole batch.

    from tests.oracles.sglang_parser import parse_with_sglang, sglang_python
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PARSE_TOOL = REPO_ROOT / "tests" / "oracles" / "sglang_parse.py"
CATALOG_TOOL = REPO_ROOT / "tools" / "gen_catalog.py"
# Importing SGLang's parser takes a few seconds; the timeout only guards against a hang.
TIMEOUT_S = 300


DEFAULT_VERSION = "0.5.23"
"""The version `.venv-sglang` holds; every other supported version has `.venv-sglang-<version>`."""


def sglang_python(version: str = DEFAULT_VERSION) -> Path:
    """The interpreter of SGLang `version`'s venv: $PDKIT_SGLANG_PYTHON (0.5.23) or
    $PDKIT_SGLANG_<version with _>_PYTHON, else `.venv-sglang/bin/python` (0.5.23) or
    `.venv-sglang-<version>/bin/python`.

    When it does not exist the calling test fails: `make test` builds it (`make deps`), so a
    missing SGLang venv is a broken setup, never a reason to skip.
    """
    default = version == DEFAULT_VERSION
    variable = (
        "PDKIT_SGLANG_PYTHON" if default else f"PDKIT_SGLANG_{version.replace('.', '_')}_PYTHON"
    )
    venv = ".venv-sglang" if default else f".venv-sglang-{version}"
    configured = os.environ.get(variable)
    python = Path(configured) if configured else REPO_ROOT / venv / "bin" / "python"
    if not python.is_absolute():
        python = REPO_ROOT / python
    if not python.exists():
        why = (
            f"SGLang {version}'s python {python} does not exist; create it with `make deps` "
            f"or point {variable} at an interpreter with sglang=={version} installed"
        )
        pytest.fail(why, pytrace=False)
    return python


def run_sglang_tool(
    tool: Path, *args: str, stdin: str | None = None, version: str = DEFAULT_VERSION
) -> subprocess.CompletedProcess[str]:
    """Run an SGLang-side script (`tests/oracles/`, `tools/gen_catalog.py`) with SGLang's
    interpreter, from the repo root."""
    return subprocess.run(
        [str(sglang_python(version)), str(tool), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=TIMEOUT_S,
        check=False,
    )


def parse_with_sglang(
    argvs: list[list[str]], version: str = DEFAULT_VERSION
) -> list[dict[str, Any]]:
    """Parse each argv (the arguments after `python -m sglang.launch_server`) with SGLang
    `version`'s own parser.

    Returns one `{"ok": bool, "error": str | None, "args": {dest: value}, "deprecations":
    [message]}` per argv, in order;
    `args` holds every ServerArgs field (unresolved input values) when `ok`, else is empty.
    """
    done = run_sglang_tool(PARSE_TOOL, stdin=json.dumps(argvs), version=version)
    if done.returncode != 0:
        pytest.fail(f"{PARSE_TOOL.name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    results: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(results) == len(argvs)
    return results
