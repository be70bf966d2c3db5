"""Two playbook steps run by Ansible on this machine, with stand-ins for what it lacks:
playbooks/stop.yml stops node rank 0 of a multi-node instance before its other nodes (SGLang's
ranks >= 1 ignore SIGTERM and exit once rank 0 is gone), on a systemd host faked by a
`systemctl` that records its calls (this machine runs no systemd); the python role's DeepGEMM
step runs each worker's flags and environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kit.hosts.playbook import run_playbook

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "@LOG@"
case "$1" in
  show) for unit in "$@"; do :; done
        state=active; grep -qx "stop $unit" "@LOG@" && state=inactive
        printf 'Id=%s\\nActiveState=%s\\nSubState=running\\nLoadState=loaded\\n' "$unit" "$state"
        printf 'UnitFileState=enabled\\n' ;;
  is-enabled) echo enabled ;;
esac
exit 0
"""


def test_rank_0_stops_before_its_followers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    log = tmp_path / "systemctl.log"
    tool = tmp_path / "bin" / "systemctl"
    tool.parent.mkdir()
    tool.write_text(FAKE_SYSTEMCTL.replace("@LOG@", str(log)))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    units = tmp_path / "units"
    units.mkdir()
    rank0, follower = "pdkit-t-decode-0.service", "pdkit-t-decode-0-node1.service"
    for unit in (rank0, follower):
        (units / unit).write_text("[Service]\n")
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "pdkit_service_manager": "systemd",
        "pdkit_systemd_unit_dir": str(units),
        "pdkit_unit_pattern": r"^pdkit-t-.*\.service$",
        # In the order pdkit lists them: the follower first.
        "pdkit_process_stop": [
            {"name": "decode-0-node1", "unit": follower, "node_rank": 1},
            {"name": "decode-0", "unit": rank0, "node_rank": 0},
        ],
    }
    inventory = {
        "all": {
            "vars": {"pdkit_deployment": "t"},
            "children": {"pdkit_hosts": {"hosts": {"h": host}}},
        }
    }
    result = run_playbook(tmp_path / "ansible", inventory, "stop.yml")
    assert result.ok, result.output_tail()
    stops = [line for line in log.read_text().splitlines() if line.startswith("stop ")]
    assert stops == [f"stop {rank0}", f"stop {follower}"]


def test_compile_deep_gemm_runs_each_listed_worker_s_flags_and_environment(tmp_path: Path):
    """The python role's DeepGEMM step (pdkit provision --compile-deep-gemm) runs
    `python -m sglang.compile_deep_gemm` with the worker's own args and env, here with a
    stand-in python that records what it was given (compiling needs a GPU)."""
    record = tmp_path / "compiled.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$HF_HOME $*" >> {record}\n')
    python.chmod(0o755)
    processes = [
        {
            "name": "prefill-0",
            "python": str(python),
            "args": ["--tp-size", "8", "--port", "30000"],
            "env": {"HF_HOME": "/hf"},
        },
        {"name": "router", "python": None, "args": [], "env": {}},
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: pdkit_hosts\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role: {name: pdkit_python, tasks_from: deep_gemm.yml}\n"
    )
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "pdkit_python": "/nowhere/python",
        "pdkit_processes": processes,
        "pdkit_python_compile_deep_gemm": ["prefill-0"],
        "pdkit_python_deep_gemm_poll": 1,
    }
    inventory = {"all": {"children": {"pdkit_hosts": {"hosts": {"h": host}}}}}
    result = run_playbook(tmp_path / "ansible", inventory, str(playbook))
    assert result.ok, result.output_tail()
    assert record.read_text() == (
        "/hf -m sglang.compile_deep_gemm --tp-size 8 --port 30000 --timeout 3600\n"
    )
