"""The test bed itself: hosts reachable over real SSH, isolated from each other's roots and from
any network beyond the bridge, and gone without a trace after teardown."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.multihost import require_testbed
from tests.support.netns import TestBed, remove_stale


def test_every_host_answers_over_ssh_with_strict_host_keys(testbed: TestBed):
    for host in testbed.hosts:
        result = testbed.ssh(host, "id -u; ip -4 -o addr show dev eth0")
        assert result.returncode == 0, result.stderr
        uid, addr = result.stdout.splitlines()
        assert uid == "0"
        assert f"inet {host.address}/24" in addr
        # A host of its own: its home, its bin/ first on PATH, not the machine's shell setup.
        env = testbed.ssh(host, "echo $HOME; echo $PATH; ls -d ~/.pyenv 2>/dev/null").stdout
        home, path = env.splitlines()[:2]
        assert home == "/root"
        assert path.startswith(f"{host.bin_dir}:")
        assert ".pyenv" not in env


def test_a_wrong_host_key_is_refused(testbed: TestBed, tmp_path: Path):
    a, b = testbed.hosts[0], testbed.hosts[1]
    bad = tmp_path / "known_hosts"
    bad.write_text(f"{a.address} {b.host_public_key}\n")  # b's key claimed for a
    result = subprocess.run(
        [
            "ssh",
            "-F",
            str(testbed.ssh_config),
            "-o",
            f"UserKnownHostsFile={bad}",
            "-o",
            "BatchMode=yes",
            a.name,
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_hosts_reach_each_other_but_no_route_leaves_the_bridge(testbed: TestBed):
    a, b = testbed.hosts[0], testbed.hosts[1]
    result = testbed.ssh(a, f"ip route get {b.address} && ip route get 1.1.1.1")
    assert f"{b.address} dev eth0" in result.stdout
    assert result.returncode != 0
    assert "unreachable" in result.stderr.lower()


def test_a_process_started_over_ssh_lives_in_the_namespace_and_dies_with_the_bed(
    tmp_path_factory: pytest.TempPathFactory,
):

    require_testbed()
    bed = TestBed(base=tmp_path_factory.mktemp("bed1"), names=("x",)).create()
    host = bed.hosts[0]
    try:
        # A daemon detached from the SSH session, binding the host's address.
        result = bed.ssh(
            host,
            f"cd {host.root} && (setsid python3 -m http.server --bind {host.address} 8080 "
            ">/dev/null 2>&1 </dev/null &)",
        )
        assert result.returncode == 0, result.stderr
        for _ in range(50):
            if host.listening(8080):
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert host.listening(8080)
        assert any("http.server" in cmd for cmd in host.processes().values())
    finally:
        bed.destroy()
    assert not Path(f"/run/netns/{host.netns}").exists()
    assert (
        subprocess.run(
            ["ip", "link", "show", bed.bridge], capture_output=True, check=False
        ).returncode
        != 0
    )
    leftover = subprocess.run(
        ["pgrep", "-f", f"--bind {host.address} 8080"], capture_output=True, text=True, check=False
    )
    assert leftover.stdout == ""


def test_leftovers_of_a_dead_run_are_removed_at_the_next_start():

    require_testbed()
    dead = "4194399z"  # above any pid_max: the run that made these is surely gone
    subprocess.run(["ip", "netns", "add", f"pdkit-{dead}-a"], check=True)
    subprocess.run(["ip", "link", "add", f"pkbr{dead}", "type", "bridge"], check=True)
    remove_stale()
    assert not Path(f"/run/netns/pdkit-{dead}-a").exists()
    shown = subprocess.run(["ip", "link", "show", f"pkbr{dead}"], capture_output=True, check=False)
    assert shown.returncode != 0
