"""The real SGLang 0.5.23 on this machine's CPU, for end-to-end tests: its interpreter (`make
sglang-cpu`), the tiny model (`tools/tiny_model.py`, run as a program: tests import no tool), a
copy of topologies/local-sglang.yaml with its own name, root and free ports, and a plain
(colocated) server started with kit's CPU profile (`kit.sglang.cpu`), always stopped.

A test that cannot find the environment fails naming what to build; it never skips.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kit.sglang import cpu
from tests.conftest import REPO
from tests.support.ports import free_ports
from tests.support.sim_launch import request_json

START_TIMEOUT_S = 420.0
"""Seconds a real server may take to answer /health: 30-110 s measured on 2 loaded cores, three
servers starting at once here."""

GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def sglang_python() -> str:
    """The interpreter of the real SGLang CPU environment; fails the test when it is missing."""
    python = os.environ.get("PDKIT_SGLANG_CPU_PYTHON") or str(
        REPO / ".venv-sglang-cpu" / "bin" / "python"
    )
    if not Path(python).exists():
        pytest.fail(
            f"the real SGLang CPU environment is not at {python}: run `make sglang-cpu` "
            "(tools/sglang_cpu/install.py; 4-5 min, cached in ~/.cache/pdkit), or set "
            "PDKIT_SGLANG_CPU_PYTHON",
            pytrace=False,
        )
    return python


def tiny_model(out: Path) -> Path:
    """The tiny Llama (seed 0) in the folder `out`, generated unless there (deterministic,
    well under a second)."""
    if not (out / "config.json").exists():
        tool = str(REPO / "tools" / "tiny_model.py")
        result = subprocess.run(
            [sglang_python(), tool, "--out", str(out), "--seed", "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            pytest.fail(f"tools/tiny_model.py failed: {result.stderr}")
    return out


def write_topology(folder: Path, name: str, model: Path, python: str) -> tuple[Path, dict]:
    """A copy of local-sglang.yaml in `folder`: own name, root, free ports, this model and
    interpreter (absolute)."""
    data = yaml.safe_load((REPO / "topologies" / "local-sglang.yaml").read_text())
    prefill, bootstrap, prefill_nccl, decode, decode_nccl, router = free_ports(6)
    data["name"] = name
    data["model"]["path"] = str(model)
    host = data["hosts"][0]
    host["root"] = f".pdkit/{name}/root"
    host["sglang_python"] = python
    data["prefill"] |= {"port": prefill, "bootstrap_port": bootstrap, "nccl_port": prefill_nccl}
    data["decode"] |= {"port": decode, "nccl_port": decode_nccl}  # decode-1 takes + 1
    data["router"]["port"] = router
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


class RealServer:
    """A plain (not disaggregated) `python -m sglang.launch_server` on the CPU, in its own
    session, logging to a file: the tokens PD must reproduce, and the sim's wire reference.

    `launch()` returns at once (so that it starts beside other servers); `wait_ready()` waits
    for /health; `start()` does both."""

    def __init__(
        self, model: Path, log_dir: Path, extra: list[str] | None = None, role: str = "null"
    ) -> None:
        """`role` prefill or decode: a PD server (Mooncake over TCP); a prefill has its
        bootstrap server at `bootstrap_port`, a decode takes KV from any prefill a request
        names."""
        self.port, nccl, self.bootstrap_port = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"sglang-{self.port}.log"
        argv = [sglang_python(), "-m", "sglang.launch_server", "--model-path", str(model)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--nccl-port", str(nccl)]
        argv += [f"--{cpu.DEVICE_FLAG}", "cpu"]
        if role in ("prefill", "decode"):
            argv += ["--disaggregation-mode", role]
            argv += ["--disaggregation-transfer-backend", "mooncake_tcp"]
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        argv += cpu.argv(role)
        self.argv = argv + list(extra or [])
        self.env = dict(os.environ) | {"SGLANG_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}
        self.env |= cpu.env("127.0.0.1", "mooncake_tcp")
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.start_s: float | None = None

    def launch(self) -> RealServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.started = time.monotonic()
        return self

    def wait_ready(self) -> float:
        """Seconds from launch to the first /health 200 seen (fails the test past the timeout,
        or when the server exits); at once when it answered before and still runs. Asked first
        long after its launch (a session's server), it is still asked once."""
        if self.start_s is not None and self.alive():
            return self.start_s
        while True:
            if not self.alive():
                pytest.fail(f"the real SGLang server exited:\n{self.log()[-3000:]}")
            with contextlib.suppress(OSError):
                if request_json(self.url + "/health", timeout_s=5)[0] == 200:
                    self.start_s = time.monotonic() - self.started
                    return self.start_s
            if time.monotonic() - self.started >= START_TIMEOUT_S:
                break
            time.sleep(1)
        self.stop()
        pytest.fail(f"the real SGLang server never answered /health:\n{self.log()[-3000:]}")

    def start(self) -> RealServer:
        self.launch().wait_ready()
        return self

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
