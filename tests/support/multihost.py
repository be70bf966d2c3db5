"""The multi-host tests' helpers (their fixtures, the bed and the wheelhouse, are in
tests/e2e/multihost/conftest.py): whether this machine can build a bed of network-namespace
hosts, a sim topology over the bed, and `pdkit` run with SSH pointed at the bed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kit.hosts.context import load_context
from tests.conftest import run_pdkit as shared_run_pdkit
from tests.support.netns import NetnsHost, TestBed, unavailable_reason

HOST_REQUIREMENTS = ["sglang-pdkit[sim]", "supervisor"]
"""What a sim host's venv needs: pdkit with the non-CUDA Mooncake build, and supervisord."""


def require_testbed() -> None:
    """Skip (or, in CI, fail) when this machine cannot build the test bed."""
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the multi-host tests, but {reason}", pytrace=False)
    pytest.skip(reason)


def bed_hosts(bed: TestBed, hosts: list[NetnsHost] | None = None) -> list[dict[str, object]]:
    """The topology's `hosts:` for the bed's hosts (default its first three): one H100 each,
    reached over SSH as root, supervisord, each host its own root."""
    return [
        {
            "name": host.name,
            "address": host.address,
            "ssh": {"user": "root", "port": host.ssh_port, "key": str(bed.ssh_key)},
            "gpus": 1,
            "gpu_type": "H100-SXM",
            "service_manager": "supervisord",
            "root": str(host.root),
        }
        for host in (bed.hosts[:3] if hosts is None else hosts)
    ]


def bed_topology(bed: TestBed, folder: Path, name: str = "mh") -> Path:
    """A sim topology over the bed: prefill on a, decode on b, router on c, KV over Mooncake
    TCP between the namespaces, supervisord on every host, each host its own root."""
    a, b, c = bed.hosts[:3]
    data = {
        "name": name,
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "llama-3.1-8b"},
        "hosts": bed_hosts(bed),
        "prefill": {"count": 1, "hosts": [a.name]},
        "decode": {"count": 1, "hosts": [b.name]},
        "defaults": {"args": {"page-size": 16}},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"kind": "pdkit", "host": c.name, "port": 8000, "bind": c.address},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def provision_shared_venv(bed: TestBed, folder: Path, wheelhouse: Path) -> None:
    """Provision the bed's first host alone (a one-host sim topology) from `wheelhouse`, then
    link every other host's venv to its (a shared file system): one provisioning serves all."""
    a = bed.hosts[0]
    data = {
        "name": "ranksvenv",
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [{**bed_hosts(bed, [a])[0], "gpus": 2}],
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"host": a.name},
    }
    path = folder / "venv.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # The hosts' OS packages are the machine's own (shared file system): check, don't install.
    provision = ["provision", str(path), "--wheelhouse", str(wheelhouse)]
    done = run_pdkit(bed, *provision, "-e", "pdkit_base_install_packages=false")
    assert done.returncode == 0, done.stdout + done.stderr
    venvs = {h.name: Path(h.layout.venv_dir) for h in load_context(path).hosts_by_name.values()}
    for host in bed.hosts[1:]:
        venv = host.root / venvs[a.name].relative_to(a.root)
        venv.parent.mkdir(parents=True, exist_ok=True)
        venv.symlink_to(venvs[a.name])


def run_pdkit(bed: TestBed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`pdkit ARGS` as a user runs it, with SSH pointed at the bed's known_hosts."""
    env = {**os.environ, **bed.ansible_env(), "COLUMNS": "200"}
    return shared_run_pdkit(*args, timeout=timeout, env=env)


def bench_records(out: Path) -> list[dict[str, object]]:
    """The per-request records `start_bench` wrote."""
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
