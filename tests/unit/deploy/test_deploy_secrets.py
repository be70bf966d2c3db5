"""The router API key: read on the control machine, errors that never show it."""

from __future__ import annotations

import pytest

from kit.deploy.secrets import api_key_path, router_api_key
from kit.errors import DeployError
from kit.topology.plan import Command, RouterProcess


def router(**key):
    return RouterProcess(
        kind="pdkit",
        host="h",
        address="127.0.0.1",
        bind="127.0.0.1",
        port=8000,
        metrics_port=None,
        prefill_policy="p",
        decode_policy="d",
        api_key_env=key.get("env"),
        api_key_file=key.get("file"),
        command=Command(module="kit.lb", args=()),
        env={},
    )


def test_no_key_configured_means_no_secret(tmp_path):
    assert router_api_key(router(), tmp_path / "t.yaml", {"K": "abc"}) is None


def test_key_from_the_named_environment_variable(tmp_path):
    assert router_api_key(router(env="K"), tmp_path / "t.yaml", {"K": " abc \n"}) == "abc"


def test_missing_variable_says_what_to_export(tmp_path):
    with pytest.raises(DeployError, match="export K=<key>"):
        router_api_key(router(env="K"), tmp_path / "t.yaml", {})


def test_relative_key_file_is_beside_the_topology(tmp_path):
    (tmp_path / "key").write_text("s3cret\n")
    assert router_api_key(router(file="key"), tmp_path / "t.yaml", {}) == "s3cret"
    assert api_key_path(router(file="key"), tmp_path / "t.yaml") == tmp_path / "key"


def test_unreadable_or_empty_key_file(tmp_path):
    with pytest.raises(DeployError, match="cannot be read"):
        router_api_key(router(file="nope"), tmp_path / "t.yaml", {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(DeployError, match="is empty"):
        router_api_key(router(file="empty"), tmp_path / "t.yaml", {})
