"""`pdkit health` / `pdkit status` as a user runs them, where nothing needs to be running."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_pdkit
from tests.support import ports

pdkit = run_pdkit


def nothing_running(write_topology, free_port) -> str:
    """A local sim topology whose ports nobody listens on."""
    data = {
        "name": "idle",
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [
            {
                "name": "localhost",
                "address": "127.0.0.1",
                "connection": "local",
                "gpus": 2,
                "service_manager": "supervisord",
            }
        ],
        "prefill": {"port": free_port(), "bootstrap_port": free_port()},
        "decode": {"port": free_port()},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"port": free_port(), "bind": "127.0.0.1"},
    }
    return str(write_topology(data))


@pytest.fixture
def free_port():
    return ports.free_port


@pytest.mark.parametrize("command", ["health", "status"])
def test_help_has_examples(command):
    result = pdkit(command, "--help")
    assert result.returncode == 0
    assert f"pdkit {command} topologies/local.yaml" in result.stdout and "Example" in result.stdout


def test_health_of_a_deployment_that_is_not_running(write_topology, free_port):
    topology = nothing_running(write_topology, free_port)
    result = pdkit("health", topology, "--timeout", "1")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["prefill-0", "decode-0", "router"]
    assert all(line.endswith("connection refused") for line in lines)
    data = json.loads(pdkit("health", topology, "--json").stdout)
    assert data["healthy"] is False and data["router"]["state"] == "down"
    assert [w["state"] for w in data["workers"]] == ["down", "down"]


def test_status_of_a_deployment_that_is_not_running_still_exits_0(write_topology, free_port):
    result = pdkit("status", nothing_running(write_topology, free_port), "--timeout", "1")
    assert result.returncode == 0, result.stderr
    assert "down" in result.stdout and "problems:" in result.stdout


def test_a_bad_topology_is_reported_once_without_a_traceback(write_topology):
    result = pdkit("health", str(write_topology("name: [unclosed")))
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_options_are_checked(write_topology, free_port):
    topology = nothing_running(write_topology, free_port)
    assert pdkit("status", topology, "--watch", "--interval", "0").returncode == 2
    assert pdkit("health", topology, "--timeout", "0").returncode == 2
