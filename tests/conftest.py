"""Shared fixtures: paths, topology builders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))


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
                "gpus": 8,
                "rdma_devices": list(nics.values()),
                "gpu_nics": dict(nics),
            },
            {
                "name": "b",
                "address": "10.0.0.2",
                "gpus": 8,
                "rdma_devices": list(nics.values()),
                "gpu_nics": dict(nics),
            },
        ],
        "prefill": {"count": 2, "tp": 2, "hosts": ["a"]},
        "decode": {"count": 1, "tp": 4, "hosts": ["b"]},
        "transfer": {"backend": "mooncake"},
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
