"""Fixtures for the multi-host tests: a bed of network-namespace hosts with their own sshd, and
the sim hosts' wheelhouse (helpers in tests/support/multihost.py).

Needs root, iproute2 and openssh-server. Skips with the reason elsewhere; under CI (env CI set)
a bed that cannot be built fails the run instead, so that the multi-host tests never silently
stop running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.multihost import HOST_REQUIREMENTS, require_testbed
from tests.support.netns import TestBed


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Three namespace hosts a, b, c, created once per session (per xdist worker: each bed has
    its own subnet) and removed at its end."""
    require_testbed()
    bed = TestBed(base=Path(tmp_path_factory.mktemp("testbed"))).create()
    try:
        yield bed
    finally:
        bed.destroy()


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sim hosts' wheels, packed once per session from this environment (no index; a few
    seconds)."""
    from kit.hosts.wheels import build_wheelhouse  # noqa: PLC0415

    folder = Path(tmp_path_factory.mktemp("wheelhouse"))
    build_wheelhouse(HOST_REQUIREMENTS, folder)
    return folder
