"""`make bench-vip`: how long the router's virtual IP takes to move when the active router dies.

Two router "hosts" as network namespaces on one bridge (this process's namespace is the
client and runs the fake PD workers, `tests.support.fake_worker`, on the bridge's address),
each running pdkit's router (`python -m kit.lb`) and keepalived (Debian's package) with the
keepalived.conf pdkit renders for `router.vip` (`kit.plan.vip.keepalived_conf`). Under load
(`--clients` clients in a closed loop sending /generate to the VIP, 1 s timeout each):

1. `router killed`: the active host's router is killed (SIGKILL): keepalived's check fails
   `check_failures` times, the instance goes to FAULT and hands the address over;
2. `host gone`: with the address back on the first host, its router is killed and its link
   cut (no goodbye: its adverts just stop; the backup takes over after about 3 adverts).

Printed for each: seconds from the kill to the first request served, and to the first request
from which every one was served (the address moved and the clients' ARP caches followed),
requests in flight on the dead router (lost), and requests sent after the kill that failed.
Target: every request served from 3 s after the kill on. Needs root, `ip`
(iproute2) and keepalived (`apt-get install keepalived`).

    python -m benchmarks.bench_vip [--clients 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.plan.vip import keepalived_conf
from kit.topology.router_ha import RouterVip
from kit.topology.schema import Topology
from tests.support.fake_worker import FakeWorkerProcess

PREFIX = "pdkvip"
BRIDGE = f"{PREFIX}-br"
NET = "10.77.0"
HOSTS = {"a": f"{NET}.1", "b": f"{NET}.2"}
VIP = f"{NET}.100/24"
PORT = 18800
TARGET_S = 3.0


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def topology() -> Topology:
    return Topology.model_validate(
        {
            "name": "vipbench",
            "engine": "sim",
            "model": {"path": "m"},
            "hosts": [
                {"name": name, "address": address, "gpus": 1, "connection": "local"}
                for name, address in HOSTS.items()
            ],
            "prefill": {"count": 1, "hosts": ["a"]},
            "decode": {"count": 1, "hosts": ["b"]},
            "router": {
                "hosts": list(HOSTS),
                "port": PORT,
                "vip": {"address": VIP, "interface": "eth0"},
            },
        }
    )


@contextlib.contextmanager
def bed(folder: Path) -> Iterator[None]:
    """The bridge, a namespace per host with its eth0 on it; removed on the way out."""
    try:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{NET}.254/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for name, address in HOSTS.items():
            ns, veth = f"{PREFIX}-{name}", f"{PREFIX}-{name}0"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", BRIDGE, "up")
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for name in HOSTS:
            sh("ip", "netns", "del", f"{PREFIX}-{name}", check=False)
            sh("ip", "link", "del", f"{PREFIX}-{name}0", check=False)
        sh("ip", "link", "del", BRIDGE, check=False)


class Host:
    """keepalived and the stand-in router in one namespace."""

    def __init__(self, name: str, folder: Path, conf: str, workers: list[str]) -> None:
        self.workers = workers
        self.name, self.ns = name, f"{PREFIX}-{name}"
        self.dir = folder / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "keepalived.conf"
        self.conf.write_text(conf)
        self.router: subprocess.Popen[bytes] | None = None
        self.keepalived: subprocess.Popen[bytes] | None = None

    def start_router(self) -> None:
        argv = [sys.executable, "-m", "kit.lb", *self.workers, "--port", str(PORT)]
        argv += ["--no-access-log", "--log-level", "warning"]
        self.router = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv],
            stdout=(self.dir / "router.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

    def start_keepalived(self) -> None:
        d = self.dir
        self.keepalived = subprocess.Popen(
            [
                *("ip", "netns", "exec", self.ns, "keepalived", "--dont-fork", "--vrrp"),
                f"--use-file={self.conf}",
                f"--pid={d}/k.pid",
                f"--vrrp_pid={d}/v.pid",
                f"--checkers_pid={d}/c.pid",
                "--log-console",
            ],
            stdout=(d / "keepalived.log").open("wb"),
            stderr=subprocess.STDOUT,
        )

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)

    def kill_router(self) -> None:
        self._kill(self.router)

    def stop_keepalived(self) -> None:
        """SIGTERM: keepalived stops its VRRP child too (SIGKILL would leave it running)."""
        proc = self.keepalived
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


BODY = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()


def generate(timeout: float, url: str | None = None) -> bool:
    """One /generate through the VIP (or `url`, a base URL): answered 200?"""
    base = url or f"http://{VIP.split('/', maxsplit=1)[0]}:{PORT}"
    request = urllib.request.Request(f"{base}/generate", data=BODY, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return r.status == 200
    except OSError:
        return False


def holder_of(vip: str, namespaces: dict[str, str]) -> str:
    """The host (name -> its namespace) whose eth0 holds `vip` now ('' for none)."""
    for name, ns in namespaces.items():
        out = sh("ip", "-n", ns, "-br", "addr", "show", "eth0", check=False)
        if any(word.split("/")[0] == vip for word in out.stdout.split()):
            return name
    return ""


def holder() -> str:
    """The host whose eth0 holds the VIP now ('' for none)."""
    return holder_of(VIP.split("/", maxsplit=1)[0], {n: f"{PREFIX}-{n}" for n in HOSTS})


def wait_for(host: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while holder() != host or not generate(1.0):
        if time.monotonic() > deadline:
            raise SystemExit(f"the VIP did not serve from {host} within {limit_s:g} s")
        time.sleep(0.2)


@dataclass(frozen=True)
class Failover:
    """Seconds from the kill to the first request served, to the VIP seen on another host
    (inf: never), and to the first request from which every one was served; requests in
    flight at the kill that failed (lost), failed after it, failed after the move."""

    first_s: float
    moved_s: float
    settled_s: float
    lost: int
    failed: int
    failed_after_move: int
    sent: int


def measure_failover(
    kill: Callable[[], None],
    send: Callable[[], bool],
    where: Callable[[], str],
    clients: int,
    window_s: float,
) -> Failover:
    """Under load from `clients` closed-loop clients (`send`: one request, served?), run
    `kill` and watch `where` the VIP is (polled every 50 ms) for `window_s` seconds."""
    records: list[tuple[float, float, bool]] = []  # sent, ended, served
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            ok = send()
            records.append((sent, time.monotonic(), ok))
            if not ok:
                time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # load first
    before = where()
    killed = time.monotonic()
    kill()
    moved = float("inf")
    while time.monotonic() < killed + window_s:
        if moved == float("inf") and where() not in ("", before):
            moved = time.monotonic()
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    lost = sum(1 for sent, ended, ok in records if sent < killed <= ended and not ok)
    after_kill = sorted((sent, ok) for sent, _, ok in records if sent >= killed)
    first = next((sent for sent, ok in after_kill if ok), float("inf"))
    failed = [sent for sent, ok in after_kill if not ok]
    # Settled: from here on every request was served (the ARP caches have the new holder).
    later = [sent for sent, ok in after_kill if sent > max(failed, default=killed)]
    settled = min(later) if later else float("inf")
    return Failover(
        first - killed,
        moved - killed,
        settled - killed,
        lost,
        len(failed),
        sum(1 for sent in failed if sent >= moved),
        len(after_kill),
    )


def failover(kill: str, active: Host, clients: int, window_s: float) -> Failover:
    """Under load, kill the active host's router (and cut its link for `host`)."""

    def act() -> None:
        active.kill_router()
        if kill == "host":  # its link cut: no goodbye advert, its adverts just stop
            sh("ip", "-n", active.ns, "link", "set", "eth0", "down")

    return measure_failover(act, lambda: generate(1.0), holder, clients, window_s)


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or shutil.which("keepalived") is None or shutil.which("ip") is None:
        print("bench-vip: needs root, ip and keepalived (apt-get install keepalived); skipped")
        return 0
    top = topology()
    vip = top.router.vip
    if not isinstance(vip, RouterVip):
        raise SystemExit("no vip")
    folder = Path(tempfile.mkdtemp(prefix="pdkit-vip-"))
    rows = []
    with bed(folder):
        fakes = FakeWorkerProcess(1, 1, host=f"{NET}.254", log_path=folder / "fake.log").start()
        workers = ["--prefill", fakes.prefills[0][0], str(fakes.prefills[0][1])]
        workers += ["--decode", fakes.decodes[0]]
        hosts = {}
        for i, name in enumerate(HOSTS):
            peers = [a for n, a in HOSTS.items() if n != name]
            conf = keepalived_conf(top, vip, name, 150 - 10 * i, peers)
            hosts[name] = Host(name, folder, conf, workers)
        try:
            for host in hosts.values():
                host.start_router()
                host.start_keepalived()
            for round_no in range(args.rounds):
                for kill in ("router", "host"):
                    wait_for("a", 30)
                    result = failover(kill, hosts["a"], args.clients, 6.0)
                    rows.append((round_no + 1, kill, result))
                    if kill == "host":
                        sh("ip", "-n", hosts["a"].ns, "link", "set", "eth0", "up")
                    hosts["a"].start_router()  # back: it takes the address again (preempt)
        finally:
            for host in hosts.values():
                host.stop_keepalived()
                host.kill_router()
            fakes.stop()
    shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\nbench-vip: 2 router hosts (network namespaces), pdkit's router on each, keepalived "
        f"{keepalived_version()}, advert every {vip.advert_interval_s:g} s, check every "
        f"{vip.check_interval_s:g} s ({vip.check_failures} failures); {args.clients} clients "
        "in a closed loop on the VIP (1 s timeout, 50 ms pause after a failure)\n"
    )
    print(
        f"{'round':>5} {'killed':<8} {'first served s':>14} {'all served s':>12} "
        f"{'lost in flight':>14} {'failed after kill':>17}"
    )
    for round_no, kill, r in rows:
        print(
            f"{round_no:>5} {kill:<8} {r.first_s:>14.2f} {r.settled_s:>12.2f} {r.lost:>14} "
            f"{r.failed:>17}"
        )
    worst = max(r.settled_s for _, _, r in rows)
    verdict = "met" if worst <= TARGET_S else "NOT met"
    print(
        f"worst: every request served from {worst:.2f} s after the kill on "
        f"(target: within {TARGET_S:g} s): {verdict}"
    )
    return 0


def keepalived_version() -> str:
    out = sh("keepalived", "--version", check=False)
    text = (out.stdout or out.stderr).split()
    return text[1] if len(text) > 1 else "?"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_vip",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
