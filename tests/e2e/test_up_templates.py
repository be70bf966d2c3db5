"""What the pdkit_process role writes on a host, rendered by Ansible itself for the branches the
local e2e test does not run: a systemd host (unit, launch script that tees into the log) and an
smg router whose API key is passed as a secret argument. Only the control machine is touched:
the role's file list is rendered with lookup('template') into a file under tmp_path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit.hosts.inventory import CONTROL_ROUTER_KEY_ENV, build_inventory, deploy_hosts
from kit.plan.resolve import resolve
from tests.conftest import REPO

TEMPLATES = REPO / "playbooks" / "roles" / "pdkit_process" / "templates"


def render_files(tmp_path: Path, inventory: dict, host: str, stage: str) -> dict[str, dict]:
    """The `files` list pdkit_files would get on `host` for `stage`, keyed by path."""
    out = tmp_path / f"{host}-{stage}.yml"
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render",
                    "hosts": host,
                    "gather_facts": False,
                    "vars_files": [str(TEMPLATES.parent / "defaults" / "main.yml")],
                    "tasks": [
                        {
                            "name": "Render the role's file list",
                            "delegate_to": "localhost",
                            "vars": {
                                "pdkit_process_list": (
                                    "{{ pdkit_processes | selectattr('stage', 'equalto', "
                                    f"'{stage}') | list }}}}"
                                )
                            },
                            "ansible.builtin.copy": {
                                "content": "{{ lookup('ansible.builtin.template', '"
                                + str(TEMPLATES / "process-files.yml.j2")
                                + "') }}",
                                "dest": str(out),
                                "mode": "0600",
                            },
                        }
                    ],
                }
            ]
        )
    )
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    inventory_arg = str(tmp_path / "inventory.json")
    env = {**os.environ, CONTROL_ROUTER_KEY_ENV: "k3y-for-test", "ANSIBLE_NOCOLOR": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["ANSIBLE_LOCALHOST_WARNING"] = "False"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            inventory_arg,
            "-e",
            "ansible_connection=local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {entry["path"]: entry for entry in yaml.safe_load(out.read_text())}


@pytest.fixture
def systemd_topology(write_topology):
    return write_topology(
        {
            "name": "prod",
            "engine": "sim",
            "model": {"path": "m"},
            "hosts": [
                {"name": "a", "address": "10.0.0.1", "gpus": 2},
                {"name": "b", "address": "10.0.0.2", "gpus": 2, "root": "/srv/b"},
            ],
            "prefill": {"hosts": ["a"]},
            "decode": {"hosts": ["b"]},
            "transfer": {"backend": "mooncake_tcp"},
            "router": {"host": "b", "kind": "smg", "api_key_env": "ROUTER_KEY"},
        }
    )


def test_systemd_host_gets_unit_script_and_env_file(tmp_path, systemd_topology):
    plan = resolve(systemd_topology)
    inventory = build_inventory(plan, deploy_hosts(plan, "/unused"))
    files = render_files(tmp_path, inventory, "a", "workers")
    assert set(files) == {
        "/etc/pdkit/prod/prefill-0.env",
        "/opt/pdkit/prod/bin/prefill-0.sh",
        "/etc/systemd/system/pdkit-prod-prefill-0.service",
    }
    unit = files["/etc/systemd/system/pdkit-prod-prefill-0.service"]
    assert unit["mode"] == "0644"
    assert "ExecStart=/opt/pdkit/prod/bin/prefill-0.sh\n" in unit["content"]
    assert "LimitMEMLOCK=infinity\n" in unit["content"]
    assert (
        "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service\n"
    ) in unit["content"]
    # A crash loop stops (the [Unit] section's start limit) instead of restarting for ever.
    assert "StartLimitIntervalSec=300\nStartLimitBurst=5\n" in unit["content"]
    assert unit["content"].index("StartLimitBurst") < unit["content"].index("[Service]")
    assert "SyslogIdentifier=pdkit-prod-prefill-0\n" in unit["content"]
    script = files["/opt/pdkit/prod/bin/prefill-0.sh"]["content"]
    assert "exec > >(exec tee -a /var/log/pdkit/prod/prefill-0.log) 2>&1\n" in script
    assert "exec /opt/pdkit/venv/bin/python -m kit.sim \\\n  --model-path m \\\n" in script
    env = files["/etc/pdkit/prod/prefill-0.env"]
    assert env["mode"] == "0600"
    assert "PDKIT_PROCESS=prefill-0\n" in env["content"]


def test_smg_router_reads_its_key_from_the_env_file_only(tmp_path, systemd_topology):
    plan = resolve(systemd_topology)
    inventory = build_inventory(plan, deploy_hosts(plan, "/unused"))
    files = render_files(tmp_path, inventory, "b", "router")
    env = files["/srv/b/etc/pdkit/prod/router.env"]["content"]
    assert "PDKIT_ROUTER_API_KEY=k3y-for-test\n" in env
    script = files["/srv/b/opt/pdkit/prod/bin/router.sh"]["content"]
    assert "exec smg launch \\\n  --pd-disaggregation" in script
    assert script.rstrip().endswith('--api-key "$PDKIT_ROUTER_API_KEY"')
    assert "k3y-for-test" not in script


def test_pdkit_router_settings_change_its_env_file_not_its_unit(tmp_path, write_topology):
    """pdkit's router is handed over (SIGUSR2) when its settings change: they reach its env
    file, which marks it changed, while its unit stays (systemd would otherwise restart it)."""
    rendered = []
    for retries in (2, 1):
        topology = write_topology(
            {
                "name": "prod",
                "engine": "sim",
                "model": {"path": "m"},
                "hosts": [{"name": "a", "address": "10.0.0.1", "gpus": 2}],
                "transfer": {"backend": "mooncake_tcp"},
                "router": {"host": "a", "faults": {"retries": retries}},
            }
        )
        plan = resolve(topology)
        inventory = build_inventory(plan, deploy_hosts(plan, "/unused"))
        folder = tmp_path / f"retries-{retries}"
        folder.mkdir()
        rendered.append(render_files(folder, inventory, "a", "router"))
    before, after = rendered
    unit = "/etc/systemd/system/pdkit-prod-router.service"
    assert before[unit]["content"] == after[unit]["content"]
    env = "/etc/pdkit/prod/router.env"
    assert before[env]["content"] != after[env]["content"]
    assert before[env]["process"] == "router"
    assert "PDKIT_LB_RELAUNCH=/opt/pdkit/prod/bin/router.sh\n" in after[env]["content"]
    script = after["/opt/pdkit/prod/bin/router.sh"]["content"]
    assert "trap '' USR2\nexec /opt/pdkit/venv/bin/python -m kit.lb" in script


def test_a_rank_of_a_multi_node_instance_runs_under_its_group_agent(tmp_path, write_topology):
    """Each rank's launch script execs pdkit's rank group agent, which runs the worker's own
    command as its child; the unit wants and follows the NVIDIA daemons (harmless if absent)."""
    topology = write_topology(
        {
            "name": "prod",
            "engine": "sim",
            "model": {"path": "m"},
            "hosts": [
                {"name": "a", "address": "10.0.0.1", "gpus": 1},
                {"name": "b", "address": "10.0.0.2", "gpus": 1},
                {"name": "c", "address": "10.0.0.3", "gpus": 1},
            ],
            "prefill": {"hosts": ["c"]},
            "decode": {"tp": 2, "hosts": ["a", "b"]},
            "transfer": {"backend": "mooncake_tcp"},
            "router": {"host": "c"},
        }
    )
    plan = resolve(topology)
    inventory = build_inventory(plan, deploy_hosts(plan, "/unused"))
    files = render_files(tmp_path, inventory, "b", "workers")
    script = files["/opt/pdkit/prod/bin/decode-0-node1.sh"]["content"]
    agent = (
        "exec /opt/pdkit/venv/bin/python -m kit.ranks --leader 10.0.0.1:5540 --node-rank 1 "
        "--nnodes 2 --restart-delay 2 --stop-timeout 50 -- /opt/pdkit/venv/bin/python -m kit.sim"
    )
    assert agent in script
    checked = subprocess.run(["bash", "-n"], input=script, text=True, check=False)
    assert checked.returncode == 0
    unit = files["/etc/systemd/system/pdkit-prod-decode-0-node1.service"]["content"]
    assert "Wants=nvidia-persistenced.service nvidia-fabricmanager.service\n" in unit
    (tmp_path / "c").mkdir()
    single = render_files(tmp_path / "c", inventory, "c", "workers")
    assert "kit.ranks" not in single["/opt/pdkit/prod/bin/prefill-0.sh"]["content"]
