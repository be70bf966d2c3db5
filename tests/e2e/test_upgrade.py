"""`pdkit upgrade` of a local sim deployment (local.yaml: 2P1D, no GPU free for a stand-in):
moved to a new model revision under light load, one instance at a time, no request fails; moved
to a decode that corrupts KV (PDKIT_SIM_FAULT=corrupt: fluent, wrong tokens), its gate fails and
the deployment is left as it was, serving, with the reason printed. One deployment for the
module; each test upgrades from whatever topology runs."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.deploy.services import supervisor_processes
from tests.support.local_deploy import chat, layout, pdkit, pids, write_topology

LOAD_INTERVAL_S = 0.5
"""Each of the two load threads sends a chat, then waits this long: about 3 requests/s."""


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """{"topology": the file that runs, "data": its content, "name": the deployment}."""
    folder = tmp_path_factory.mktemp("upgrade")
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(folder, name)
    up = pdkit("up", str(topology))
    assert up.returncode == 0, up.stdout + up.stderr
    state = {"topology": topology, "data": data, "name": name, "first": topology}
    yield state
    if supervisor_processes(layout(topology, name).supervisord_socket) is not None:
        pdkit("down", str(state["topology"]))


def _target(
    running: dict[str, Any], file_name: str, change: Callable[[dict[str, Any]], None]
) -> tuple[Path, dict[str, Any]]:
    """The running topology with `change` made, written beside it as `file_name`."""
    data = copy.deepcopy(running["data"])
    change(data)
    path = running["topology"].parent / file_name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


class Load:
    """Chats through the router from two threads until stopped: (sent, failures)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                chat(self.base_url, stream=False)
            except Exception as exc:  # any failure is what is counted
                self.failures.append(repr(exc))
            self._stop.wait(LOAD_INTERVAL_S)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def test_an_upgrade_under_load_moves_every_instance_and_fails_no_request(running, capsys):
    topology, name = running["topology"], running["name"]
    target, data = _target(running, "revision-2.yaml", lambda d: d["model"].update(revision="v2"))
    dry = pdkit("upgrade", str(topology), "--to", str(target), "--dry-run", timeout=90)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    with capsys.disabled():
        print(dry.stdout)
    text = " ".join(dry.stdout.split())
    assert "1. replace prefill-0 (--revision v2 added): the prefills at 1 of 2 for about" in text
    assert "the decodes at 0 of 1 for about" in text
    assert "the router holds the decodes' requests meanwhile" in text
    assert "Below its count" in text and "Nothing was changed (--dry-run)." in text
    before = pids(topology, name)

    base_url = f"http://127.0.0.1:{running['data']['router']['port']}"
    started = time.monotonic()
    with Load(base_url) as load:
        result = pdkit("upgrade", str(topology), "--to", str(target))
    took = time.monotonic() - started
    with capsys.disabled():
        print(f"\nupgrade of 3 instances: {took:.1f} s, {load.sent} requests, "
              f"{len(load.failures)} failed")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    running.update(topology=target, data=data)
    with capsys.disabled():
        print(result.stdout)
    out = " ".join(result.stdout.split())
    assert "the router holds their role's requests until they are back" in out
    assert "Upgraded: every instance runs" in out
    # Each new instance gated against what runs (a new prefill with the old decode too).
    assert out.count("tokens compared with the answer before the upgrade") == 3
    assert not load.failures, (load.sent, load.failures[:3])
    assert load.sent > 10
    after = pids(target, name)
    for instance in ("prefill-0", "prefill-1", "decode-0"):
        assert after[instance] != before[instance]
    assert after["router"] == before["router"]
    diff = pdkit("up", str(target), "--diff", timeout=60)
    assert "no change: every process runs with the topology's settings" in diff.stdout
    assert not (target.parent / ".pdkit" / name / "upgrade.json").exists()


def test_an_upgrade_whose_gate_fails_rolls_back_and_serves_as_before(running, capsys):
    topology, name = running["topology"], running["name"]
    corrupt = {"PDKIT_SIM_FAULT": "corrupt"}
    target, _ = _target(running, "corrupt.yaml", lambda d: d["decode"].update(env=corrupt))
    before = pids(topology, name)
    result = pdkit("upgrade", str(topology), "--to", str(target))
    assert result.returncode != 0
    with capsys.disabled():
        print(result.stdout + result.stderr)
    text = " ".join((result.stdout + result.stderr).split())
    assert "gave other tokens than the answer before the upgrade" in text, text[-3000:]
    assert "The upgrade stopped at decode-0 (The KV transfer gate failed: of 2 prefill x" in text
    assert "2 gave wrong tokens" in text
    assert "rolling the upgraded instances back" in text
    assert "--no-gate" not in text  # the gate's advice for `pdkit up` is left out
    assert "was rolled back: every instance runs" in text
    assert "Rolled back: every instance runs" in text
    # The old decode is gated again before it rejoins (the failed one's and its own gate).
    assert text.count("tokens compared with the answer before the upgrade") == 2
    after = pids(topology, name)
    for kept in ("prefill-0", "prefill-1", "router"):
        assert after[kept] == before[kept]
    diff = pdkit("up", str(topology), "--diff", timeout=60)
    assert "no change: every process runs with the topology's settings" in diff.stdout
    assert chat(f"http://127.0.0.1:{running['data']['router']['port']}", stream=False)
    assert not (topology.parent / ".pdkit" / name / "upgrade.json").exists()
