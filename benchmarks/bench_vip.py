"""`make bench-vip`: how long the router's virtual IP takes to move when the active router dies.

Two router "hosts" as network namespaces on one bridge (this process's namespace is the
client), each running keepalived (Debian's package) with the keepalived.conf pdkit renders for
`router.vip` (`kit.plan.vip.keepalived_conf`), and a stand-in router: a small HTTP server on
the router's port that answers /health and names its host (the real router's part, its health
endpoint, is what keepalived's check reads). A client asks the VIP every `--every-ms`; then

1. `router killed`: the active host's router process is killed (keepalived's check fails
   `check_failures` times, the instance goes to FAULT and hands the address over);
2. `host gone`: with the address back on the first host, its router is killed and its link
   cut (no goodbye: its adverts just stop; the backup takes over after about 3 adverts).

Printed for each: seconds from the kill to the first answer from the other host, requests that
failed in between, requests after the move that failed (target: none), and the 3 s target.
Needs root, `ip` (iproute2) and keepalived (`apt-get install keepalived`).

    python -m benchmarks.bench_vip [--every-ms 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from kit.plan.vip import keepalived_conf
from kit.topology.router_ha import RouterVip
from kit.topology.schema import Topology

PREFIX = "pdkvip"
BRIDGE = f"{PREFIX}-br"
NET = "10.77.0"
HOSTS = {"a": f"{NET}.1", "b": f"{NET}.2"}
VIP = f"{NET}.100/24"
PORT = 18800
TARGET_S = 3.0
SERVER = """
import http.server, socket, sys
name = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[2])), H).serve_forever()
"""


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

    def __init__(self, name: str, folder: Path, conf: str) -> None:
        self.name, self.ns = name, f"{PREFIX}-{name}"
        self.dir = folder / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "keepalived.conf"
        self.conf.write_text(conf)
        self.router: subprocess.Popen[bytes] | None = None
        self.keepalived: subprocess.Popen[bytes] | None = None

    def start_router(self) -> None:
        self.router = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", SERVER, self.name, str(PORT)]
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

    def kill_keepalived(self) -> None:
        self._kill(self.keepalived)


def ask(timeout: float) -> str:
    """Which host answers on the VIP ('' for none)."""
    try:
        with urllib.request.urlopen(
            f"http://{VIP.split('/', maxsplit=1)[0]}:{PORT}/", timeout=timeout
        ) as r:
            return r.read().decode()
    except OSError:
        return ""


def wait_for(host: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while ask(0.3) != host:
        if time.monotonic() > deadline:
            raise SystemExit(f"the VIP did not answer from {host} within {limit_s:g} s")
        time.sleep(0.1)


def failover(kill: str, active: Host, every_s: float, window_s: float) -> tuple[float, int, int]:
    """Kill the active host's router (or all of it), then ask every `every_s` for `window_s`:
    (seconds to the first answer from the other host, failures before, failures after)."""
    active.kill_router()
    if kill == "host":  # its link cut: no goodbye advert, its adverts just stop
        sh("ip", "-n", active.ns, "link", "set", "eth0", "down")
    start = time.monotonic()
    moved_at: float | None = None
    before = after = 0
    while time.monotonic() - start < window_s:
        sent = time.monotonic()
        who = ask(min(every_s * 4, 0.5))
        if who and who != active.name:
            moved_at = moved_at or sent - start
        elif moved_at is None:
            before += 1
        else:
            after += 1
        time.sleep(max(0.0, every_s - (time.monotonic() - sent)))
    return (moved_at if moved_at is not None else float("inf")), before, after


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
        hosts = {}
        for i, name in enumerate(HOSTS):
            peers = [a for n, a in HOSTS.items() if n != name]
            hosts[name] = Host(name, folder, keepalived_conf(top, vip, name, 150 - 10 * i, peers))
        try:
            for host in hosts.values():
                host.start_router()
                host.start_keepalived()
            for round_no in range(args.rounds):
                for kill in ("router", "host"):
                    wait_for("a", 30)
                    moved, before, after = failover(kill, hosts["a"], args.every_ms / 1000, 8.0)
                    rows.append((round_no + 1, kill, moved, before, after))
                    if kill == "host":
                        sh("ip", "-n", hosts["a"].ns, "link", "set", "eth0", "up")
                    hosts["a"].start_router()  # back: it takes the address again (preempt)
        finally:
            for host in hosts.values():
                host.kill_keepalived()
                host.kill_router()
    shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\nbench-vip: 2 router hosts (network namespaces), keepalived {keepalived_version()}, "
        f"advert every {vip.advert_interval_s:g} s, check every {vip.check_interval_s:g} s "
        f"({vip.check_failures} failures), a request to the VIP every {args.every_ms:g} ms\n"
    )
    print(f"{'round':>5} {'killed':<8} {'VIP moved s':>11} {'failed before':>13} {'after':>6}")
    for round_no, kill, moved, before, after in rows:
        print(f"{round_no:>5} {kill:<8} {moved:>11.2f} {before:>13} {after:>6}")
    worst = max(r[2] for r in rows)
    lost_after = sum(r[4] for r in rows)
    verdict = "met" if worst <= TARGET_S and lost_after == 0 else "NOT met"
    print(
        f"worst move {worst:.2f} s, requests failed after a move: {lost_after} "
        f"(target: within {TARGET_S:g} s, none after): {verdict}"
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
    p.add_argument("--every-ms", type=float, default=50.0)
    p.add_argument("--rounds", type=int, default=2)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
