"""The pdkit_process role on a real supervisord, run by Ansible on this machine with processes
that only sleep (seconds, not a deployment): a program whose file an earlier run deleted but
never unloaded (the run failed before its handler) is stopped and unloaded by the next run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.deploy.services import supervisor_processes, supervisor_proxy
from kit.hosts.playbook import run_playbook
from kit.topology.layout import HostLayout, unit_pattern

DEPLOYMENT = "e2e-role"


def process(layout: HostLayout, name: str) -> dict[str, Any]:
    """A worker record as kit.hosts.inventory writes it, whose process sleeps."""
    return {
        "name": name,
        "role": "decode",
        "stage": "workers",
        "unit": f"pdkit-{DEPLOYMENT}-{name}.service",
        "log_tag": name,
        "env_file": layout.env_file(name),
        "launch_script": layout.launch_script(name),
        "program_conf": layout.program_conf(name),
        "log_file": layout.log_file(name),
        "python": None,
        "module": None,
        "executable": "sleep",
        "args": ["3600"],
        "secret_args": [],
        "env": {},
        "secret_env": {},
        "files": [],
        "directories": [],
    }


def inventory(layout: HostLayout, names: list[str]) -> dict[str, Any]:
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "pdkit_root": layout.root,
        "pdkit_python": sys.executable,
        "pdkit_service_manager": "supervisord",
        **layout.ansible_vars(),
        "pdkit_unit_pattern": unit_pattern(DEPLOYMENT),
        "pdkit_processes": [process(layout, name) for name in names],
        "pdkit_process_start_seconds": 1,
    }
    return {
        "all": {
            "vars": {"pdkit_deployment": DEPLOYMENT},
            "children": {
                "pdkit_hosts": {"hosts": {"h": host}},
                "pdkit_workers": {"hosts": {"h": {}}},
            },
        }
    }


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, HostLayout]]:
    """(ansible dir, layout): decode-0 and decode-1 running under the role's supervisord."""
    tmp = tmp_path_factory.mktemp("role")
    layout = HostLayout(deployment=DEPLOYMENT, root=str(tmp / "root"))
    try:
        first = run_playbook(
            tmp / "ansible", inventory(layout, ["decode-0", "decode-1"]), "deploy.yml"
        )
        assert first.ok, first.output_tail()
        yield tmp / "ansible", layout
    finally:
        if supervisor_processes(layout.supervisord_socket) is not None:
            supervisor_proxy(layout.supervisord_socket).supervisor.shutdown()


def test_a_program_whose_file_is_gone_stops_at_the_next_run(deployed):
    ansible, layout = deployed
    running = supervisor_processes(layout.supervisord_socket)
    assert running is not None
    assert set(running) == {"decode-0", "decode-1"}
    stale = running["decode-1"].pid
    # decode-1 scaled away by a run that deleted its program file, then failed before its
    # handler unloaded it: it still runs, and no file says so any more.
    Path(layout.program_conf("decode-1")).unlink()

    again = run_playbook(ansible, inventory(layout, ["decode-0"]), "deploy.yml")
    assert again.ok, again.output_tail()
    running = supervisor_processes(layout.supervisord_socket)
    assert running is not None
    assert set(running) == {"decode-0"}
    assert not Path(f"/proc/{stale}").exists()

    idle = run_playbook(ansible, inventory(layout, ["decode-0"]), "deploy.yml")
    assert idle.ok, idle.output_tail()
    assert idle.progress.changes == []
