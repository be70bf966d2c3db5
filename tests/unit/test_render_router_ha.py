"""The router's processes and client limits from the topology (router.processes,
router.limits): rendered for pdkit's router as it reads them back, refused for smg, checked
by `pdkit validate` before any host is touched."""

from __future__ import annotations

import hashlib

import pytest

from kit.errors import TopologyError
from kit.lb.config import parse_args
from kit.plan.resolve import resolve
from tests.conftest import base_topology

KEY_HASH = hashlib.sha256(b"sk-team-a").hexdigest()


def test_processes_and_limits_render_as_the_router_reads_them(write_topology):
    data = base_topology()
    data["router"] = {
        "processes": 2,
        "limits": [{"name": "team-a", "key_sha256": KEY_HASH, "requests_per_s": 5}],
        "args": {"prefill-max-inflight": 4},
    }
    args = resolve(write_topology(data)).router.command.args
    assert "sk-team-a" not in " ".join(args)  # only the hash
    config = parse_args(args, environ={})
    assert config.processes == 2
    assert config.client_limits == f"team-a={KEY_HASH}:5:0:1"


def test_defaults_render_nothing_new(write_topology):
    args = " ".join(resolve(write_topology(base_topology())).router.command.args)
    assert "--processes" not in args and "--client-limits" not in args


@pytest.mark.parametrize(
    ("router", "expected"),
    [
        ({"kind": "smg", "processes": 2}, "only pdkit's router runs several"),
        (
            {"limits": [{"name": "a", "key_sha256": KEY_HASH}]},
            "has no limit: set requests_per_s",
        ),
        (
            {
                "limits": [
                    {"name": "a", "key_sha256": KEY_HASH, "requests_per_s": 1},
                    {"name": "b", "key_sha256": KEY_HASH, "requests_per_s": 1},
                ]
            },
            "share the key_sha256",
        ),
        ({"limits": [{"name": "a", "key_sha256": "sk-plain", "requests_per_s": 1}]}, "pattern"),
        (
            {"processes": 4, "args": {"prefill-max-inflight": 2}},
            "cannot be split over --processes 4",
        ),
    ],
)
def test_bad_router_settings_are_told_before_any_host_is_touched(write_topology, router, expected):
    data = base_topology()
    data["router"] = router
    with pytest.raises(TopologyError, match=expected):
        resolve(write_topology(data))


def test_tls_files_render_as_paths_and_make_the_router_url_https(write_topology):
    data = base_topology()
    data["router"] = {"tls": {"cert_file": "/etc/pdkit/lb.crt", "key_file": "/etc/pdkit/lb.key"}}
    router = resolve(write_topology(data)).router
    config = parse_args(router.command.args, environ={})
    assert (config.tls_cert, config.tls_key) == ("/etc/pdkit/lb.crt", "/etc/pdkit/lb.key")
    assert router.url.startswith("https://") and router.tls
    data["router"]["tls"]["cert_file"] = "lb.crt"
    with pytest.raises(TopologyError, match="pattern"):
        resolve(write_topology(data, "relative.yaml"))
    data["router"]["tls"]["cert_file"] = "/etc/pdkit/lb.crt"
    data["monitoring"] = {}
    with pytest.raises(TopologyError, match="scrapes the router over plain HTTP"):
        resolve(write_topology(data, "monitored.yaml"))
