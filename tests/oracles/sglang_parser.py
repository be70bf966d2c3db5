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


def sglang_python() -> Path:
    """The SGLang venv's interpreter: $PDKIT_SGLANG_PYTHON, else `.venv-sglang/bin/python`.

    When it does not exist the calling test fails: `make test` builds it (`make deps`), so a
    missing SGLang venv is a broken setup, never a reason to skip.
    """
    configured = os.environ.get("PDKIT_SGLANG_PYTHON")
    python = Path(configured) if configured else REPO_ROOT / ".venv-sglang" / "bin" / "python"
    if not python.is_absolute():
        python = REPO_ROOT / python
    if not python.exists():
        why = (
            f"SGLang's python {python} does not exist; create it with `make deps` "
            "or point PDKIT_SGLANG_PYTHON at an interpreter with sglang installed"
        )
        pytest.fail(why, pytrace=False)
    return python


def run_sglang_tool(
    tool: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run an SGLang-side script (`tests/oracles/`, `tools/gen_catalog.py`) with SGLang's
    interpreter, from the repo root."""
    return subprocess.run(
        [str(sglang_python()), str(tool), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=TIMEOUT_S,
        check=False,
    )


def parse_with_sglang(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Parse each argv (the arguments after `python -m sglang.launch_server`) with SGLang.

    Returns one `{"ok": bool, "error": str | None, "args": {dest: value}, "deprecations":
    [message]}` per argv, in order;
    `args` holds every ServerArgs field (unresolved input values) when `ok`, else is empty.
    """
    done = run_sglang_tool(PARSE_TOOL, stdin=json.dumps(argvs))
    if done.returncode != 0:
        pytest.fail(f"{PARSE_TOOL.name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    results: list[dict[str, Any]] = json.loads(done.stdout)
    assert len(results) == len(argvs)
    return results
