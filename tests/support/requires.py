"""What a test needs from the machine, said as a failure, never a skip.

`make test` installs every OS package and venv the suite uses (`make os-packages`, `make deps`),
so a missing one is a broken setup: the test fails naming what to install, instead of passing
quietly on a machine where it never ran."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO


def require_command(name: str, package: str) -> str:
    """The path of the executable `name`; fails the test naming the Debian `package`."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed: `make os-packages` (apt-get install {package})",
            pytrace=False,
        )
    return path


def require_file(path: Path | str, fix: str) -> Path:
    """`path`, which must exist; fails the test saying how to make it (`fix`)."""
    found = Path(path)
    if not found.exists():
        pytest.fail(f"{found} does not exist: {fix}", pytrace=False)
    return found


def require_smg() -> str:
    """The SGLang Model Gateway's executable: $PDKIT_SMG, else the smg venv's (`make deps`);
    fails the test saying how to install it."""
    path = os.environ.get("PDKIT_SMG") or str(REPO / ".venv-smg" / "bin" / "smg")
    require_file(path, "make deps (the smg venv, .venv-smg: pip install smg==1.13.0)")
    return path
