"""Fixtures of the end-to-end tests. Their helpers live in tests/support (local_deploy for the
deployments of topologies/local.yaml); the markers come from the folders (tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.deploy.services import supervisor_processes
from tests.support.local_deploy import layout, shut_down, write_topology


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, str, dict]]:
    """(topology, name, data): a fresh copy of local.yaml under tmp_path, not yet up; a test
    changes `data`, writes it to `topology` and runs `pdkit up`. Shut down at the end (its
    supervisord and every process of it) if anything of it still runs."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(tmp_path, name)
    yield topology, name, data
    if supervisor_processes(layout(topology, name).supervisord_socket) is not None:
        shut_down(topology, name)
