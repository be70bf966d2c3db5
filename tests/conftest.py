"""Shared fixtures (paths, topology builders) and the markers each test folder gives its tests.

tests/unit/ needs nothing but this venv. Under tests/e2e/ every test starts real processes or
tools and is marked `e2e`; its folders add what they need on top:

    tests/e2e/sglang/       `sglang`: SGLang's own parser and hooks, in .venv-sglang
    tests/e2e/real_sglang/  `real_sglang`: the real engine on the CPU, .venv-sglang-cpu
    tests/e2e/multihost/    `netns`: root, network namespaces and sshd

`make test-unit` is `-m "not e2e and not sglang"`, i.e. tests/unit/. A marker that is not a
folder's (`index`: reaches the package index) is set in its test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))

FOLDER_MARKS = {
    ("e2e",): ("e2e",),
    ("e2e", "sglang"): ("sglang",),
    ("e2e", "real_sglang"): ("real_sglang",),
    ("e2e", "multihost"): ("netns",),
}
"""Markers of the tests under each folder of tests/ (and of its subfolders)."""

ONE_WORKER_FOLDERS = (("e2e", "real_sglang"),)
"""Folders whose tests run in one pytest-xdist worker, in file order: the real engine's, which
share the session's real servers (real_sglang/conftest.py) and start no two PD deployments at
once (`make test` runs the folder beside the other workers, from the start: the longest group)."""
WORKER_OF_ITS_OWN = {
    "test_real_sglang.py": "test_real_sglang.py",
    "test_router_tokenizer_real.py": "test_real_sglang.py",
}
"""Modules of those folders that run in a worker of their own (module -> the group's first
module): the real PD deployment's (about 10 minutes, the suite's longest group), beside the
folder's other modules, which start their own session servers there (one more real start,
against minutes off the longest group). The router tokenizer's real tests go after it in its
worker, on the plain server it started (no start of their own; they kill it last)."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = REPO / "tests"
    for item in items:
        path = item.path.relative_to(tests)
        folders = path.parts[:-1]
        for folder, marks in FOLDER_MARKS.items():
            if folders[: len(folder)] == folder:
                for mark in marks:
                    item.add_marker(mark)
        # `make test` spreads the tests over xdist workers (--dist loadgroup). An e2e module's
        # tests stay together in one worker, in file order: they share its module fixtures
        # (a deployment, a cluster, real servers) and some build on the one before.
        if folders[:1] == ("e2e",) and item.get_closest_marker("xdist_group") is None:
            if folders[:2] not in ONE_WORKER_FOLDERS:
                group = "/".join(path.parts)
            elif path.name in WORKER_OF_ITS_OWN:
                group = "/".join((*folders, WORKER_OF_ITS_OWN[path.name]))
            else:
                group = "/".join(folders[:2])
            item.add_marker(pytest.mark.xdist_group(group))


def run_pdkit(
    *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`pdkit ARGS` as a user runs it (this interpreter, from the repo root); never raises on a
    non-zero exit. `env` replaces the environment when given."""
    return subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(env) if env is not None else dict(os.environ),
        timeout=timeout,
    )


def base_topology() -> dict:
    """A valid two-host sglang topology that tests mutate to make one mistake each."""
    nics = {i: f"mlx5_{i}" for i in range(8)}
    return {
        "name": "t",
        "engine": "sglang",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [
            {
                "name": "a",
                "address": "10.0.0.1",
                "network_interface": "eth0",
                "gpus": 8,
                "rdma_devices": list(nics.values()),
                "gpu_nics": dict(nics),
            },
            {
                "name": "b",
                "address": "10.0.0.2",
                "network_interface": "eth0",
                "gpus": 8,
                "rdma_devices": list(nics.values()),
                "gpu_nics": dict(nics),
            },
        ],
        "prefill": {"count": 2, "tp": 2, "hosts": ["a"]},
        "decode": {"count": 1, "tp": 4, "hosts": ["b"]},
        "transfer": {"backend": "mooncake", "fabric": "infiniband"},
        "router": {"host": "a"},
    }


@pytest.fixture
def write_topology(tmp_path: Path):
    """Write a dict (or raw YAML text) to a file and return its path."""

    def write(data: dict | str, name: str = "topology.yaml") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return path

    return write
