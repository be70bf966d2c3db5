"""The pdkit_process role's check of the files the workers' flags name and of the executables
processes run, by Ansible on this machine: a missing file fails before anything starts, naming
the file, the process and the flag; a missing executable (smg) names it and the process;
present ones pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

TASKS = REPO / "playbooks" / "roles" / "pdkit_process" / "tasks" / "inputs.yml"


def run_check(
    tmp_path: Path, files: list[list[str]], router_executable: str | None = None
) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "check.yml"
    router = {"name": "router", "executable": router_executable}
    processes = [{"name": "prefill-0-node1", "input_files": files, "executable": None}, router]
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {
                        "pdkit_processes": processes,
                        "pdkit_python": str(tmp_path / "venv" / "bin" / "python"),
                        "ansible_python_interpreter": sys.executable,
                    },
                    "tasks": [{"ansible.builtin.include_tasks": str(TASKS)}],
                }
            ]
        )
    )
    ansible = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run(
        [str(ansible), "-i", "localhost,", str(playbook)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )


def test_a_missing_file_fails_naming_it_and_a_present_one_passes(tmp_path):
    present = tmp_path / "deepep.json"
    present.write_text("{}")
    missing = str(tmp_path / "eplb.json")
    done = run_check(
        tmp_path, [["--deepep-config", str(present)], ["--init-expert-location", missing]]
    )
    assert done.returncode != 0
    assert f"lacks {missing} (prefill-0-node1 --init-expert-location)" in done.stdout
    assert str(present) + " (" not in done.stdout
    ok = run_check(tmp_path, [["--deepep-config", str(present)]])
    assert ok.returncode == 0, ok.stdout


def test_a_router_executable_missing_from_the_host_fails_before_any_start(tmp_path):
    missing = run_check(tmp_path, [], router_executable="smg-not-installed")
    assert missing.returncode != 0
    assert "has no smg-not-installed (run by router)" in missing.stdout
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    smg = venv_bin / "smg-not-installed"  # installed into the venv by pdkit provision
    smg.write_text("#!/bin/sh\n")
    smg.chmod(0o755)
    ok = run_check(tmp_path, [], router_executable="smg-not-installed")
    assert ok.returncode == 0, ok.stdout
