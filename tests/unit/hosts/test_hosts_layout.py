"""Where a deployment's files go: state dir on the control machine, root prefix on each host."""

from __future__ import annotations

import hashlib
import re
from fnmatch import fnmatch
from pathlib import Path

import jinja2
import pytest
import yaml

from kit.hosts.state_dir import state_dir
from kit.topology.layout import (
    MAX_SOCKET_PATH,
    HostLayout,
    host_root,
    process_name,
    unit_name,
    unit_pattern,
)
from tests.conftest import REPO


def test_state_dir_is_beside_the_topology_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("PDKIT_STATE_DIR", raising=False)
    topology = tmp_path / "topologies" / "local.yaml"
    assert state_dir(topology, "local") == tmp_path / "topologies" / ".pdkit" / "local"


def test_state_dir_option_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PDKIT_STATE_DIR", str(tmp_path / "env"))
    topology = tmp_path / "t.yaml"
    assert state_dir(topology, "x") == tmp_path / "env" / "x"
    assert state_dir(topology, "x", tmp_path / "opt") == tmp_path / "opt" / "x"


def test_relative_root_is_taken_from_the_topology_folder(tmp_path):
    folder = tmp_path / "topologies"
    assert host_root(".pdkit/local/root", folder) == f"{tmp_path}/topologies/.pdkit/local/root"
    assert host_root("/srv/a/", folder) == "/srv/a"
    assert host_root("/", folder) == "/"


def test_layout_under_the_root_prefix():
    layout = HostLayout("local", "/r")
    assert layout.env_file("decode-0") == "/r/etc/pdkit/local/decode-0.env"
    assert layout.launch_script("decode-0") == "/r/opt/pdkit/local/bin/decode-0.sh"
    assert layout.log_file("router") == "/r/var/log/pdkit/local/router.log"
    assert layout.supervisord_socket == "/r/run/pdkit/local/supervisord.sock"
    assert HostLayout("prod", "/").config_dir == "/etc/pdkit/prod"


@pytest.mark.parametrize(
    "process", ["router", "prefill-0", "decode-12", process_name("decode-1", 1, 2)]
)
def test_the_unit_pattern_matches_exactly_the_deployments_units(process):
    pattern = re.compile(unit_pattern("prod"))
    assert unit_name("prod", "decode-0") == "pdkit-prod-decode-0.service"
    assert pattern.match(unit_name("prod", process))
    assert not pattern.match(unit_name("prod-2", process))  # a deployment whose name extends it
    assert not pattern.match(unit_name("prod", process) + ".bak")
    assert not pattern.match(unit_name("pro", process))


def test_a_deep_root_moves_the_supervisord_socket_to_a_short_path():
    layout = HostLayout("local", "/tmp/" + "x" * 120)
    socket = layout.supervisord_socket
    assert len(socket) <= MAX_SOCKET_PATH
    assert socket.startswith("/tmp/pdkit-local-")
    assert socket != HostLayout("local", "/tmp/" + "y" * 120).supervisord_socket


def _render_group_vars(values: dict[str, str], file: str = "group_vars/all.yml") -> dict[str, str]:
    """Evaluate a variables file of playbooks/ like Ansible would, for the path variables."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["ansible.builtin.path_join"] = lambda parts: str(Path(*parts))
    env.filters["ansible.builtin.hash"] = lambda text, kind: hashlib.new(
        kind, text.encode()
    ).hexdigest()
    raw = yaml.safe_load((REPO / "playbooks" / file).read_text())
    known = dict(values)
    for _ in range(5):  # variables refer to each other: resolve until stable
        for key, template in raw.items():
            if isinstance(template, str) and key not in values:
                try:
                    known[key] = env.from_string(template).render(**known).strip()
                except jinja2.UndefinedError:
                    continue
    return known


@pytest.mark.parametrize("root", ["/", "/srv/hosts/a", "/tmp/" + "d" * 100])
def test_group_vars_compute_the_same_layout_as_python(root):
    layout = HostLayout("local", root)
    rendered = _render_group_vars({"pdkit_root": root, "pdkit_deployment": "local"})
    for key, value in layout.ansible_vars().items():
        assert rendered[key] == value, key


def test_role_defaults_put_the_venv_and_weights_where_the_layout_says():
    layout = HostLayout("local", "/srv/a")
    python = _render_group_vars({"pdkit_root": "/srv/a"}, "roles/pdkit_python/defaults/main.yml")
    model = _render_group_vars({"pdkit_root": "/srv/a"}, "roles/pdkit_model/defaults/main.yml")
    assert python["pdkit_python_venv"] == layout.venv_dir
    assert model["pdkit_model_hf_home"] == layout.hf_home


def _role_task(file: str, name_part: str) -> dict:
    tasks = yaml.safe_load((REPO / "playbooks" / "roles" / "pdkit_process" / file).read_text())
    (task,) = [t for t in tasks if name_part in t["name"]]
    return task


def test_systemd_hosts_rotate_every_process_log_in_place():
    """Under systemd a process writes its log file through `tee -a`: the role's logrotate
    configuration covers each log file the Plan names, rotates it in place (copytruncate) at
    the size and count of the role's defaults, and `down` removes it."""
    layout = HostLayout("dsv3", "/srv/a")
    known = _render_group_vars({"pdkit_root": "/srv/a", "pdkit_deployment": "dsv3"})
    defaults = yaml.safe_load(
        (REPO / "playbooks" / "roles" / "pdkit_process" / "defaults" / "main.yml").read_text()
    )
    assert defaults["pdkit_process_logrotate"] is True
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = lambda text, pattern, repl: re.sub(pattern, repl, text)
    task = _role_task("tasks/systemd.yml", "rotated")
    module = task["ansible.builtin.copy"]
    values = {**defaults, **known}
    dest = env.from_string(module["dest"]).render(**values)
    assert dest == known["pdkit_logrotate_file"] == "/etc/logrotate.d/pdkit-dsv3"
    config = env.from_string(module["content"]).render(**values)
    lines = [line.strip() for line in config.splitlines() if not line.startswith("#")]
    pattern, *directives, close = lines
    assert pattern == f"{layout.log_dir}/*.log {{" and close == "}"
    assert fnmatch(layout.log_file("decode-0-node1"), pattern.removesuffix(" {"))
    assert "size 100M" in directives and "rotate 5" in directives  # 100MB: logrotate's 100M
    assert {"copytruncate", "compress", "missingok"} <= set(directives)
    removed = _role_task("tasks/stop.yml", "logrotate")
    assert removed["ansible.builtin.file"] == {
        "path": "{{ pdkit_logrotate_file }}",
        "state": "absent",
    }
