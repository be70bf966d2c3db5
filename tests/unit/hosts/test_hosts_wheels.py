"""Wheels packed from the control machine's environment: the dependency closure, reproducible
bytes, and wheels that pip installs offline into a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

import pytest
from packaging.utils import canonicalize_name

from kit.errors import DeployError
from kit.hosts.wheels import (
    _tags,
    build_wheelhouse,
    pack_wheelhouse,
    pdkit_wheel,
    requirement_closure,
)
from tests.conftest import REPO


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(d.metadata["Name"]) for d in requirement_closure(requirements)}


def test_the_closure_follows_extras_and_markers():
    sim = names(["sglang-pdkit[sim]"])
    assert {"sglang-pdkit", "mooncake-transfer-engine-non-cuda", "pydantic", "pydantic-core"} <= sim
    assert "pytest" not in sim  # only in the [test] extra
    assert "mooncake-transfer-engine-non-cuda" not in names(["sglang-pdkit"])


def test_a_package_that_is_not_installed_is_named():
    with pytest.raises(DeployError, match="no-such-package is not installed"):
        requirement_closure(["no-such-package"])


def test_wheel_tags_are_compressed_like_pip_names_them():
    text = "Tag: cp311-cp311-manylinux_2_17_x86_64\nTag: cp311-cp311-manylinux2014_x86_64\n"
    assert _tags(text) == "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"
    assert _tags("Tag: py2-none-any\nTag: py3-none-any\n") == "py2.py3-none-any"


def test_pdkit_s_wheel_is_reproducible_and_complete(tmp_path):
    first = pdkit_wheel(tmp_path / "one")
    second = pdkit_wheel(tmp_path / "two")
    assert first.read_bytes() == second.read_bytes()
    listed = zipfile.ZipFile(first).namelist()
    assert "kit/cli/__init__.py" in listed
    assert "kit/sglang/catalogs/0.5.23.json" in listed
    assert "sglang_pdkit-0.1.0.dist-info/entry_points.txt" in listed
    assert not [n for n in listed if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheelhouse_installs_offline_into_a_fresh_venv(tmp_path):
    folder = tmp_path / "wh"
    wheels = build_wheelhouse(["typer"], folder)
    assert {w.name.split("-")[0].lower() for w in wheels} >= {"typer", "rich", "shellingham"}
    archive = pack_wheelhouse(folder, tmp_path / "wh.tar")
    assert pack_wheelhouse(folder, tmp_path / "again.tar").read_bytes() == archive.read_bytes()
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(w.name for w in wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip from this interpreter installs into the new venv; --no-index: nothing is fetched.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(folder),
            "typer",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    result = subprocess.run(
        [str(venv / "bin/typer"), "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "Typer" in result.stdout or "typer" in result.stdout.lower()


def test_an_empty_wheelhouse_is_refused(tmp_path):
    with pytest.raises(DeployError, match="holds no wheels"):
        pack_wheelhouse(tmp_path, tmp_path / "wh.tar")


def test_the_wheelhouse_tool_packs_a_sim_host_s_venv_from_this_environment(tmp_path):
    # Run as a user runs it (tests never import tools/).
    out = tmp_path / "wh"
    tool = [sys.executable, "-m", "tools.wheelhouse"]
    result = subprocess.run(
        [*tool, "--out", str(out), "--engine", "sim", "--from-installed"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    built = {p.name.split("-")[0] for p in out.glob("*.whl")}
    assert {"sglang_pdkit", "mooncake_transfer_engine_non_cuda", "supervisor"} <= built
