"""The pdkit_process role's check of the files the workers' flags name, run by Ansible on this
machine: a missing file fails before anything starts, naming the file, the process and the
flag; present files pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

pytestmark = __import__("pytest").mark.e2e

TASKS = REPO / "playbooks" / "roles" / "pdkit_process" / "tasks" / "inputs.yml"


def run_check(tmp_path: Path, files: list[list[str]]) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "check.yml"
    processes = [{"name": "prefill-0-node1", "input_files": files}, {"name": "router"}]
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {
                        "pdkit_processes": processes,
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
