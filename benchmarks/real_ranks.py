"""`make real-ranks`, by hand (not in the suite: five real SGLang servers start, minutes on 2
cores): the real SGLang 0.5.23 on this machine's CPU, one decode instance over two ranks on two
namespace hosts of the multi-host bed (`tests.support.netns`), and a rank of it SIGKILLed under
load (#35).

The bed: five hosts a-e, each with its own network namespace, sshd and /dev/shm (SGLang takes
ranks that share one for ranks of one node), and the real engine's venv and its interpreter
seen read-only at their own paths (the hosts' /root is otherwise their own). Host a is
provisioned from a wheelhouse of this environment (pdkit and supervisord), the other hosts'
venvs link to it. `pdkit up` of an engine-sglang topology on CPU hosts: the prefill (tp 1) and
the router on a; `--decodes` decode instances of tp 2, each over two hosts (decode-0: rank 0 on
b, rank 1 on c; decode-1 on d and e), torch.distributed over gloo on eth0.

1. The reference: a plain one-process server (tp 1) in the root namespace, greedy tokens of a
   few prompts, stopped before the bed starts (memory).
2. The same prompts through the router: the 2-rank decodes' tokens must equal the reference's.
3. Under `pdkit bench` load (`--rate` requests/s), node rank 1 of decode-0 (its SGLang process
   on c) is SIGKILLed; nobody runs a command. Printed: seconds from the kill to decode-0 unhealthy,
   to decode-0 healthy again with both ranks new, the requests sent and failed meanwhile (with
   `--decodes 1` the role has no other instance: the router holds them for `--hold` seconds,
   then answers 503).
4. The prompts again through the router: the restarted instance's tokens equal the reference's.

    .venv/bin/python -m benchmarks.real_ranks [--decodes 2] [--rate 0.2] [--hold S]

The rate is light on purpose: at 1 request/s of these (16 tokens) this machine's 2 cores are
saturated with both decodes up (TTFT already 10-20 s); a restarting instance's two ranks take
most of the CPU while they load, and the router's 30 s first-token timeout then fails requests
on the other decode for want of CPU, not for the kill (measured at 1 req/s: 55 of 209).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from kit.hosts.context import load_context
from kit.hosts.wheels import build_wheelhouse
from kit.topology.plan_types import WorkerProcess
from tests.support.local_deploy import end_bench, start_bench
from tests.support.multihost import (
    HOST_REQUIREMENTS,
    bed_hosts,
    bench_records,
    provision_shared_venv,
    run_pdkit,
)
from tests.support.netns import NetnsHost, TestBed, unavailable_reason
from tests.support.real_sglang import GREEDY, RealServer, sglang_python, tiny_model
from tests.support.sim_launch import healthy

PROMPTS = ["The capital of France is", "One, two, three,", "def fibonacci(n):"]
OMP_BIND = "0-1"
"""Each rank's cores (SGLANG_CPU_OMP_THREADS_BIND): its host's two, the machine's."""


def post(url: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, {"error": error.read().decode(errors="replace")}


def greedy(url: str) -> list[list[int]]:
    """The output ids of PROMPTS through `url`'s /generate (greedy, 16 tokens each)."""
    out = []
    for prompt in PROMPTS:
        status, answer = post(url + "/generate", {"text": prompt, "sampling_params": GREEDY})
        if status != 200:
            raise SystemExit(f"/generate at {url}: {status} {answer}")
        out.append(answer["output_ids"])
    return out


def through_pair(prefill: WorkerProcess, decode: WorkerProcess) -> list[int]:
    """The first prompt's output ids through one given prefill and decode instance (both legs
    at once, as a PD router sends them): the decode's own answer, no router choosing."""
    body = {
        "text": PROMPTS[0],
        "sampling_params": GREEDY,
        "bootstrap_host": prefill.address,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, prefill.url + "/generate", body)
        status, answer = post(decode.url + "/generate", body)
        first.result()
    if status != 200:
        raise SystemExit(f"/generate at {decode.url}: {status} {answer}")
    return list(answer["output_ids"])


def venv_mounts(python: str) -> tuple[Path, ...]:
    """The folders under /root the real engine's interpreter needs on a host: its venv and the
    base interpreter its pyvenv.cfg names."""
    venv = Path(python).parent.parent.resolve()
    config = {}
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    base = Path(config["home"]).parent
    return tuple(p for p in (venv, base) if p.is_relative_to("/root"))


def topology(
    bed: TestBed, folder: Path, model: Path, python: str, *, decodes: int, hold: float | None
) -> Path:
    hosts = []
    for host in bed_hosts(bed, bed.hosts):
        del host["gpu_type"]
        hosts.append(host | {"gpus": 0, "device": "cpu", "network_interface": "eth0"})
        hosts[-1]["sglang_python"] = python
    data = {
        "name": "realranks",
        "engine": "sglang",
        "model": {"path": str(model), "served_name": "tiny-llama"},
        "hosts": hosts,
        "prefill": {"count": 1, "hosts": ["a"]},
        "decode": {
            "count": decodes,
            "tp": 2,
            "hosts": [h.name for h in bed.hosts[1:]],
            "env": {"SGLANG_CPU_OMP_THREADS_BIND": OMP_BIND},
        },
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"kind": "pdkit", "host": "a", "port": 8000, "bind": bed.hosts[0].address},
    }
    if hold is not None:
        data["router"]["faults"] = {"hold_timeout_s": hold}
    path = folder / "realranks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rank_pids(host: NetnsHost) -> set[int]:
    """The SGLang rank processes on `host`: each a child of its group's agent (kit.ranks)."""
    procs = host.processes()
    agents = {pid for pid, cmd in procs.items() if "-m kit.ranks" in cmd}
    out = set()
    for pid in procs:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) in agents:
            out.add(pid)
    return out


def kill_and_measure(bed: TestBed, path: Path, folder: Path, rate: float) -> int:
    """Step 3; returns the failed requests."""
    plan = load_context(path).plan
    rank0 = next(w for w in plan.workers if w.instance_name == "decode-0" and w.node_rank == 0)
    b, c = bed.host(rank0.host), bed.host("c")
    before = {"b": rank_pids(b), "c": rank_pids(c)}
    (rank1,) = before["c"]
    out = folder / "bench"
    load = ["--rate", str(rate), "--duration", "900", "--requests", str(int(rate * 900))]
    load += ["--input-len", "32", "--output-len", "16", "--timeout", "300"]
    bench = start_bench(path, out, *load)
    try:
        time.sleep(8)
        killed, killed_at = time.monotonic(), time.time()
        os.kill(rank1, signal.SIGKILL)
        print(f"SIGKILL node rank 1 of decode-0 (pid {rank1} on c)", flush=True)
        down = back = None
        while time.monotonic() - killed < 900:
            up = healthy(rank0.url, 2)
            if down is None and not up:
                down = time.monotonic() - killed
                print(f"decode-0 unhealthy {down:.1f} s after the kill", flush=True)
            now = {"b": rank_pids(b), "c": rank_pids(c)}
            fresh = all(now[n] and not now[n] & before[n] for n in now)
            if down is not None and up and fresh:
                back = time.monotonic() - killed
                break
            time.sleep(0.5)
        if back is None:
            print("decode-0 did not come back within 900 s")
            return -1
        print(f"decode-0 healthy again, both ranks new, {back:.1f} s after the kill", flush=True)
        output = end_bench(bench, tail_s=5, timeout=400)
    finally:
        if bench.poll() is None:
            bench.kill()
    records = bench_records(out)
    failed = [r for r in records if not r["ok"]]
    print(f"load: {len(records)} requests at {rate:g}/s, {len(failed)} failed")
    started = json.loads((out / "summary.json").read_text())["started_at"]
    window = (killed_at - started, killed_at - started + back)
    away = [r for r in records if window[0] <= r["sent_s"] <= window[1]]
    ttft = sorted(r["ttft_ms"] / 1000 for r in away if r["ok"])
    if ttft:
        p50, p99 = ttft[len(ttft) // 2], ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))]
        print(
            f"while decode-0 was away: {len(away)} sent, {sum(not r['ok'] for r in away)} failed, "
            f"TTFT p50 {p50:.1f} s, p99 {p99:.1f} s"
        )
    for record in failed[:5]:
        print(f"  failed: {json.dumps(record)[:300]}")
    if bench.returncode not in (0, 1):
        print(output[-2000:])
    log = Path(rank0.log_path).read_text(errors="replace")
    print("rank group log (decode-0, node rank 0):")
    for line in log.splitlines():
        if "pdkit rank group" in line:
            print(f"  {line}")
    return len(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decodes", type=int, default=2, help="decode instances (tp 2 each)")
    parser.add_argument("--rate", type=float, default=0.2, help="requests/s under the kill")
    parser.add_argument(
        "--hold",
        type=float,
        help="router.faults.hold_timeout_s (s): how long the router holds a request while the "
        "role has no healthy instance (default the topology's, 5 s)",
    )
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    folder = Path(tempfile.mkdtemp(prefix="pdkit-real-ranks-"))
    python = sglang_python()
    model = tiny_model(folder / "tiny-llama")
    reference = RealServer(model, folder).start()
    try:
        expected = greedy(reference.url)
    finally:
        reference.stop()
    print(f"reference (one process, tp 1): started in {reference.start_s:.0f} s", flush=True)
    names = tuple("abcde"[: 1 + 2 * args.decodes])
    bed = TestBed(base=folder / "bed", names=names, exposed=venv_mounts(python), private_shm=True)
    bed.create()
    path = topology(bed, folder, model, python, decodes=args.decodes, hold=args.hold)
    up_done = False
    try:
        wheelhouse = folder / "wheelhouse"
        build_wheelhouse(HOST_REQUIREMENTS, wheelhouse)
        provision_shared_venv(bed, folder, wheelhouse)
        started = time.monotonic()
        up = run_pdkit(bed, "up", str(path), "--gate-timeout", "300", timeout=2400)
        up_done = True
        print(f"pdkit up: rc {up.returncode} in {time.monotonic() - started:.0f} s", flush=True)
        if up.returncode != 0:
            print(up.stdout[-6000:], up.stderr[-4000:])
            return 1
        router = f"http://{bed.hosts[0].address}:8000"
        tokens = greedy(router)
        same = tokens == expected
        print(f"greedy tokens through the 2-rank decodes == one process's: {same}")
        failed = kill_and_measure(bed, path, folder, args.rate)
        after = greedy(router)
        print(f"greedy tokens after the restart == one process's: {after == expected}")
        plan = load_context(path).plan
        prefill = plan.role("prefill")[0]
        decode0 = next(w for w in plan.role("decode") if w.instance_name == "decode-0")
        direct = through_pair(prefill, decode0) == expected[0]
        print(f"the same through prefill-0 and the restarted decode-0 alone: {direct}")
        status = run_pdkit(bed, "status", str(path), timeout=120)
        print(status.stdout[-3000:])
        return 0 if same and after == expected and direct and failed == 0 else 1
    finally:
        if up_done:
            run_pdkit(bed, "down", str(path), timeout=300)
        bed.destroy()


if __name__ == "__main__":
    sys.exit(main())
