"""The real SGLang 0.5.23 on this machine's CPU, for end-to-end tests: its interpreter (`make
sglang-cpu`), the tiny model (`tools/tiny_model.py`, run as a program: tests import no tool), a
copy of topologies/local-sglang.yaml with its own name, root and free ports, and a colocated
reference server started with kit's CPU profile.

A test that cannot find the environment fails naming what to build; it never skips.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kit.sglang import cpu
from tests.conftest import REPO
from tests.support.local_deploy import free_ports
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
            "PDKIT_SGLANG_CPU_PYTHON"
        )
    return python


def tiny_model(python: str, folder: Path) -> Path:
    """The tiny Llama in `folder` (generated, deterministic, well under a second)."""
    out = folder / "tiny-llama"
    result = subprocess.run(
        [python, str(REPO / "tools" / "tiny_model.py"), "--out", str(out), "--seed", "0"],
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


class Colocated:
    """A plain (not disaggregated) real SGLang server: the tokens PD must reproduce."""

    def __init__(self, python: str, model: Path, log: Path) -> None:
        self.port, nccl = free_ports(2)
        argv = [python, "-m", "sglang.launch_server", "--model-path", str(model)]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--nccl-port", str(nccl)]
        argv += [f"--{cpu.DEVICE_FLAG}", "cpu"]
        argv += [arg for flag, value in cpu.args("null").items() for arg in (f"--{flag}", value)]
        env = dict(os.environ) | {"SGLANG_HOST_IP": "127.0.0.1"}
        env |= cpu.env("127.0.0.1", "mooncake_tcp")
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.started = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self) -> float:
        """Seconds from launch to the first /health 200."""
        while time.monotonic() - self.started < START_TIMEOUT_S:
            if self.process.poll() is not None:
                pytest.fail(f"the colocated SGLang exited: {self.log.read_text()[-3000:]}")
            try:
                if request_json(self.url + "/health", timeout_s=5)[0] == 200:
                    return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(1)
        pytest.fail(f"the colocated SGLang never answered /health: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
