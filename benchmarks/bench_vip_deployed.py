"""`make bench-vip-deployed`: the router's VIP moving on a deployment `pdkit provision` and
`pdkit up` made, on the multi-host bed (`tests.support.netns`: three namespace hosts reached
over SSH).

The topology: prefill and decode on a (sim engine, Mooncake TCP), pdkit's router on b and c
(`router.hosts`) behind a VIP on the bed's subnet (`router.vip`), keepalived provisioned and
configured by `pdkit provision` (the hosts' OS packages are the machine's own), supervisord
managing the processes. Under load (`--clients` closed-loop clients in the root namespace
sending /generate to the VIP, 1 s timeout each):

1. `router killed`: the router on the host holding the VIP is killed (SIGKILL; supervisord
   starts it again): keepalived's health check fails, the VIP moves to the other replica,
   and comes back once the first is healthy again (VRRP preemption);
2. `host gone`: the holder's router is killed and its link cut (its adverts stop).

First, a router setting changed by `pdkit up` under the same load: the replicas handed over
one at a time (the order `pdkit up` printed), and the requests that failed meanwhile.
Printed for each kill: seconds from the kill to the first request served, to the VIP seen on the
other host, and to the first request from which every one was served; requests in flight on
the dead router (lost), requests failed after the kill, and failed after the move.
Needs root, iproute2, openssh-server and keepalived.

    python -m benchmarks.bench_vip_deployed [--clients 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from benchmarks.bench_vip import Failover, generate, holder_of, measure_failover, sh
from kit.hosts.wheels import build_wheelhouse
from tests.support.multihost import HOST_REQUIREMENTS, bed_topology, run_pdkit
from tests.support.netns import NetnsHost, TestBed, unavailable_reason

PORT = 8000
WINDOW_S = 8.0


def _topology(bed: TestBed, folder: Path) -> tuple[Path, str]:
    path = bed_topology(bed, folder, "vipdeployed")
    data = yaml.safe_load(path.read_text())
    assert bed.subnet is not None
    vip = str(bed.subnet.network_address + 100)
    # The workers on a alone: cutting a router host's link must not cut a worker off.
    data["hosts"][0]["gpus"] = 2
    data["decode"]["hosts"] = ["a"]
    data["router"] = {
        "kind": "pdkit",
        "hosts": ["b", "c"],
        "port": PORT,
        "vip": {"address": f"{vip}/{bed.subnet.prefixlen}", "interface": "eth0"},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, vip


def _pdkit(bed: TestBed, *args: str, timeout: float = 600) -> float:
    started = time.monotonic()
    result = run_pdkit(bed, *args, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"pdkit {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return time.monotonic() - started


def _kill_router(host: NetnsHost) -> None:
    """SIGKILL every router process in the host's namespace (supervisord starts it again)."""
    for pid, cmdline in host.processes().items():
        if "kit.lb" in cmdline:
            os.kill(pid, signal.SIGKILL)


def _wait_served(
    send: Callable[[], bool], where: Callable[[], str], host: str, limit_s: float
) -> None:
    deadline = time.monotonic() + limit_s
    while not (where() == host and send()):
        if time.monotonic() > deadline:
            raise SystemExit(f"the VIP did not serve from {host} within {limit_s:g} s")
        time.sleep(0.2)


def run(args: argparse.Namespace) -> int:
    reason = unavailable_reason()
    if reason or shutil.which("keepalived") is None:
        print(f"bench-vip-deployed: {reason or 'no keepalived'}; skipped")
        return 0
    folder = Path(tempfile.mkdtemp(prefix="pdkit-vipdeployed-"))
    bed = TestBed(base=folder / "bed").create()
    rows: list[tuple[int, str, Failover]] = []
    try:
        wheels = folder / "wheels"
        build_wheelhouse(HOST_REQUIREMENTS, wheels)
        topology, vip = _topology(bed, folder)
        provision_s = _pdkit(
            bed, "provision", str(topology), "--wheelhouse", str(wheels),
            "-e", "pdkit_base_install_packages=false",
        )  # fmt: skip
        up_s = _pdkit(bed, "up", str(topology))
        print(f"provision {provision_s:.0f} s, up {up_s:.0f} s")
        url = f"http://{vip}:{PORT}"
        namespaces = {h.name: h.netns for h in bed.hosts if h.name in ("b", "c")}

        def send() -> bool:
            return generate(1.0, url)

        def where() -> str:
            return holder_of(vip, namespaces)

        _wait_served(send, where, "b", 60)
        rolled = rolling_change(bed, topology, send, args.clients)
        for round_no in range(args.rounds):
            for kill in ("router", "host"):
                _wait_served(send, where, "b", 60)
                active = bed.host("b")

                def act(active: NetnsHost = active, kill: str = kill) -> None:
                    _kill_router(active)
                    if kill == "host":
                        sh("ip", "-n", active.netns, "link", "set", "eth0", "down")

                result = measure_failover(act, send, where, args.clients, WINDOW_S)
                rows.append((round_no + 1, kill, result))
                print(round_no + 1, kill, result, flush=True)
                if kill == "host":
                    sh("ip", "-n", active.netns, "link", "set", "eth0", "up")
                    # b held the VIP alone on its cut link and takes it back without a new
                    # announcement: forget the client's stale ARP entry (c's MAC).
                    sh("ip", "neigh", "flush", "to", vip)
        _pdkit(bed, "status", str(topology), timeout=120)
        _pdkit(bed, "down", str(topology), timeout=300)
    finally:
        bed.destroy()  # every process in the namespaces, keepalived's daemons too
        shutil.rmtree(folder, ignore_errors=True)
    print(rolled)
    print(
        f"\nbench-vip-deployed: pdkit provision + pdkit up of a two-replica router (b, c) "
        f"behind a keepalived VIP on the multi-host bed; {args.clients} clients in a closed "
        "loop on the VIP (1 s timeout, 50 ms pause after a failure)\n"
    )
    print(
        f"{'round':>5} {'killed':<8} {'first served s':>14} {'VIP moved s':>11} "
        f"{'all served s':>12} {'lost in flight':>14} {'failed after kill':>17} "
        f"{'failed after move':>17} {'sent':>6}"
    )
    for round_no, kill, r in rows:
        print(
            f"{round_no:>5} {kill:<8} {r.first_s:>14.2f} {r.moved_s:>11.2f} "
            f"{r.settled_s:>12.2f} {r.lost:>14} {r.failed:>17} {r.failed_after_move:>17} "
            f"{r.sent:>6}"
        )
    return 0


def rolling_change(bed: TestBed, topology: Path, send: Callable[[], bool], clients: int) -> str:
    """A router setting changed by `pdkit up` under load through the VIP: the replicas are
    handed over one at a time; what failed meanwhile, and the order `pdkit up` printed."""
    data = yaml.safe_load(topology.read_text())
    data["router"]["faults"] = {"retries": 1}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    results: list[bool] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            results.append(send())

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    started = time.monotonic()
    result = run_pdkit(bed, "up", str(topology), timeout=600)
    took = time.monotonic() - started
    stop.set()
    for t in threads:
        t.join()
    if result.returncode != 0:
        raise SystemExit(f"pdkit up (a router setting) failed:\n{result.stdout}\n{result.stderr}")
    order = [line.strip() for line in result.stdout.splitlines() if "replica " in line]
    return (
        f"rolling change (--retries 1 by pdkit up, {took:.0f} s) under {clients} clients on the "
        f"VIP: {results.count(False)} of {len(results)} requests failed\n  " + "\n  ".join(order)
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_vip_deployed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
