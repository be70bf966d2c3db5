"""The air-gapped wheelhouse's resolution, for real against the package index (pip's resolver
with the index's metadata, no download): a sim host's whole set resolves for Python 3.11 on
x86_64 manylinux with the tool's default platform tags, sglang-kernel 0.4.10 (SGLang
0.5.23's kernels, only a manylinux2014 wheel on PyPI) is found with them but not with
manylinux_2_28 alone, and SGLang 0.5.23 itself (one cp311 manylinux_2_34 wheel) is found with
them but not with the manylinux_2_28 / _2_17 / 2014 tags of glibc 2.28. The whole SGLang set
(215 packages, about 80 s here) is resolved by hand: docs/provisioning.md has the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.index

KERNELS = "sglang-kernel==0.4.10"


def resolve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.wheelhouse", "--resolve-only", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_sim_hosts_set_resolves_for_x86_64_manylinux():
    done = resolve("--engine", "sim")
    assert done.returncode == 0, done.stderr
    resolved = set(done.stdout.split())
    assert "mooncake-transfer-engine-non-cuda==0.3.13.post1" in resolved
    assert {r.split("==")[0] for r in resolved} >= {"supervisor", "aiohttp", "ansible-core"}


def test_the_default_platforms_find_sglangs_manylinux2014_kernels():
    # --no-deps: the kernels' own dependencies (torch's CUDA 13 wheels) are another question.
    done = resolve("--engine", "sim", "--no-deps", "--extra", KERNELS)
    assert done.returncode == 0, done.stderr
    assert KERNELS in done.stdout.split()
    one = resolve(
        "--engine", "sim", "--no-deps", "--extra", KERNELS, "--platform", "manylinux_2_28_x86_64"
    )
    # One platform finds none of the manylinux2014-only wheels: sglang-kernel's, and the router's
    # tokenizers (whichever pip meets first).
    assert one.returncode != 0
    assert any(
        f"No matching distribution found for {name}" in one.stderr
        for name in ("sglang-kernel==0.4.10", "tokenizers")
    ), one.stderr


def test_the_default_platforms_find_sglang_0_5_23_s_manylinux_2_34_wheel():
    done = resolve("--engine", "sglang", "--no-deps")
    assert done.returncode == 0, done.stderr
    assert {"sglang==0.5.23", "mooncake-transfer-engine-cuda13==0.3.13.post1"} <= set(
        done.stdout.split()
    )
    assert "manylinux_2_34_x86_64" in done.stdout.splitlines()[-1]  # the tags line
    old = resolve("--engine", "sglang", "--no-deps", "--glibc", "2.28")
    assert old.returncode != 0
    assert "No matching distribution found for sglang==0.5.23" in old.stderr
