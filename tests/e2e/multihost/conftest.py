"""Fixtures for the multi-host tests: a bed of network-namespace hosts with their own sshd.

Needs root, iproute2 and openssh-server. Skips with the reason elsewhere; under CI (env CI set)
a bed that cannot be built fails the run instead, so that the multi-host tests never silently
stop running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns import TestBed, unavailable_reason


def require_testbed() -> None:
    """Skip (or, in CI, fail) when this machine cannot build the test bed."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the multi-host tests, but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Three namespace hosts a, b, c, created once per session and removed at its end."""
    require_testbed()
    bed = TestBed(base=Path(tmp_path_factory.mktemp("testbed"))).create()
    try:
        yield bed
    finally:
        bed.destroy()
