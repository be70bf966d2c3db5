"""`pip install sglang-pdkit` gives a pdkit that deploys: the wheel built from this tree holds
the playbooks, and installed with the `sim` extra into a fresh venv outside the checkout, its
`pdkit up` serves a copy of topologies/local.yaml and its `pdkit down` leaves nothing running.

Fast and offline: pdkit's dependencies are installed from wheels packed from this test venv
(kit.hosts.wheels, the same code as `pdkit provision --wheelhouse`; a few seconds), pinned to
the versions installed here; nothing is byte-compiled ahead of use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from kit.hosts.wheels import (
    PDKIT_DISTRIBUTION,
    requirement_closure,
    wheel_from_installed,
)
from tests.conftest import REPO
from tests.support.local_deploy import API_KEY, API_KEY_ENV, chat, processes_of, write_topology

UP_TIMEOUT_S = 240


def build_wheel(out: Path) -> Path:
    """pdkit's wheel, built by pip from a copy of what goes into it (a build in the checkout
    would leave build/ there, and a later build would reuse its stale files)."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("kit", "playbooks"):
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    # This venv's setuptools (the test extra), so that no build environment is downloaded.
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*build, "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("*.whl")
    return wheel


def dependency_wheels(folder: Path) -> list[str]:
    """Wheels of pdkit's dependencies with the sim extra, packed from this venv into `folder`;
    returns the pins (name==version) that make pip take exactly them."""
    pins = []
    for dist in requirement_closure([f"{PDKIT_DISTRIBUTION}[sim]"]):
        name = dist.metadata["Name"]
        if canonicalize_name(name) == PDKIT_DISTRIBUTION:
            continue
        wheel_from_installed(dist, folder)
        pins.append(f"{name}=={dist.version}")
    return pins


def shipped_files() -> set[str]:
    """What the wheel must hold: every file of kit/ (modules, catalogs, model configs) and of
    playbooks/ (roles' tasks, templates, handlers, defaults, meta, library modules and files;
    group_vars)."""
    found = set()
    for folder, prefix in ((REPO / "kit", "kit"), (REPO / "playbooks", "kit/playbooks")):
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(f"{prefix}/{path.relative_to(folder).as_posix()}")
    return found


def clean_env() -> dict[str, str]:
    """This environment without anything that points back into the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PDKIT_PLAYBOOKS", "PDKIT_STATE_DIR", "VIRTUAL_ENV"}
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if str(REPO) not in p
    )
    env[API_KEY_ENV] = API_KEY
    return env


def processes_mentioning(folder: Path) -> list[str]:
    """Command lines of the processes that name something under `folder`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode(errors="replace") for a in argv if a)
        if str(folder) in line:
            found.append(line)
    return found


def test_the_installed_wheel_deploys_the_local_topology_from_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    listed = set(zipfile.ZipFile(wheel).namelist())
    assert shipped_files() - listed == set()
    assert "kit/playbooks/roles/pdkit_process/library/pdkit_files.py" in listed
    assert "kit/playbooks/group_vars/all.yml" in listed
    assert not [n for n in listed if "__pycache__" in n or n.endswith(".pyc")]

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pins = dependency_wheels(wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python, pdkit = venv / "bin" / "python", venv / "bin" / "pdkit"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    install += ["--no-index", "--no-compile", "--find-links", str(wheels)]
    install += [f"{PDKIT_DISTRIBUTION}[sim] @ {wheel.as_uri()}", *pins]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr

    work = tmp_path / "work"
    work.mkdir()
    env = clean_env()

    def run(*argv: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    where = run(
        python, "-c", "import kit, sysconfig; print(kit.__file__, sysconfig.get_path('purelib'))"
    )
    module, site = where.stdout.split()
    assert Path(module).is_relative_to(site) and Path(site).is_relative_to(venv), where.stdout

    name = f"e2e-wheel-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(work, name)
    router_url = f"http://127.0.0.1:{data['router']['port']}"
    try:
        up = run(pdkit, "up", topology.name, timeout=UP_TIMEOUT_S)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"Serving llama-3.1-8b at {router_url}" in up.stdout
        running = processes_of(name)
        assert running
        # Every process of the deployment runs the venv's pdkit, none the checkout's.
        for pid in running:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            assert str(venv) in line and str(REPO) not in line, line
        assert chat(router_url, stream=False)

        down = run(pdkit, "down", topology.name, timeout=UP_TIMEOUT_S)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "Stopped deployment" in down.stdout
        deadline = time.monotonic() + 10
        while (
            processes_of(name) or processes_mentioning(tmp_path)
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(name) == []
        assert processes_mentioning(tmp_path) == []
    finally:
        if processes_of(name) or processes_mentioning(tmp_path):
            run(pdkit, "down", topology.name, timeout=UP_TIMEOUT_S)
