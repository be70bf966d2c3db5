"""Start the real SGLang 0.5.23 on the CPU (the venv `make sglang-cpu` builds) with the tiny
model, for the tests that compare pdkit's sim with it; always stop it.

The venv's python comes from PDKIT_SGLANG_CPU_PYTHON (the Makefile exports it) or
.venv-sglang-cpu/bin/python; a missing venv fails the test with the command that builds it
(never a skip). The CPU flags and environment are tools/sglang_cpu/cpu_profile.py's, asked of it
as a program (tests do not import tools), and the model is tools/tiny_model.py's, built once
per session directory.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.sim_launch import free_port

START_TIMEOUT_S = 300.0  # 30-110 s measured here on a loaded 2-core machine


def python() -> str:
    """The SGLang CPU venv's python; fails the test when it is not built."""
    path = os.environ.get("PDKIT_SGLANG_CPU_PYTHON") or str(
        REPO / ".venv-sglang-cpu" / "bin" / "python"
    )
    if not Path(path).exists():
        pytest.fail(
            f"the real SGLang CPU environment is missing ({path}). To fix: `make sglang-cpu` "
            "(or `make test`, which builds it)",
            pytrace=False,
        )
    return path


def cpu_profile(option: str) -> str:
    done = subprocess.run(
        [python(), str(REPO / "tools" / "sglang_cpu" / "cpu_profile.py"), option],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def cpu_env() -> dict[str, str]:
    """cpu_profile.py's environment (its `export NAME=value  # why` lines)."""
    env = {}
    for line in cpu_profile("--env").splitlines():
        assignment = line.removeprefix("export ").split("  #", 1)[0].strip()
        name, _, value = assignment.partition("=")
        env[name] = value
    return env


def tiny_model(folder: Path) -> Path:
    """tools/tiny_model.py's model (seed 0) in `folder`, built unless there."""
    if not (folder / "config.json").exists():
        subprocess.run(
            [python(), str(REPO / "tools" / "tiny_model.py"), "--out", str(folder), "--seed", "0"],
            check=True,
            capture_output=True,
        )
    return folder


class RealServer:
    """`python -m sglang.launch_server` on the CPU, in its own session, logging to a file."""

    def __init__(self, model: Path, log_dir: Path, extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"sglang-{self.port}.log"
        self.argv = [
            python(),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--nccl-port",
            str(free_port()),
            *shlex.split(cpu_profile("--flags")),
            *(extra or []),
        ]
        self.env = {**os.environ, **cpu_env(), "HF_HUB_OFFLINE": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s: float | None = None

    def start(self) -> RealServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        started = time.monotonic()
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            if self.healthy():
                self.start_s = time.monotonic() - started
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SGLang not healthy after {START_TIMEOUT_S:g} s:\n{self.log()[-3000:]}")

    def healthy(self) -> bool:
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(self.url + "/health", timeout=3) as answer,
        ):
            return bool(answer.status == 200)
        return False

    def alive(self) -> bool:
        """The server process still runs (a scheduler that crashes takes it down with it)."""
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children that outlived their parent
        self.proc.wait()
