"""Once, by hand (not in the suite): can the real SGLang 0.5.23 on this machine's CPU run
HiCache with the mooncake storage backend against the real Mooncake Store master?

    .venv/bin/python -m benchmarks.kvpool_sglang_cpu [--io-backend direct|kernel]

Starts the master (tests/support/kvpool.py), a plain `sglang.launch_server --device cpu` with
kit's CPU profile plus `--enable-hierarchical-cache --hicache-storage-backend mooncake` and the
MOONCAKE_* environment pdkit renders, sends one prompt twice, flushes the device cache between
them (so that a second hit must come from host memory or the pool), and prints what happened:
the server's start (or its last log lines), each answer's cached_tokens_details, the master's
objects. What it printed is in docs/sim.md ("Real SGLang on CPU and the pool").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

from kit.observe.prom import parse_metrics
from tests.support.kvpool import PoolMaster
from tests.support.real_sglang import RealServer, tiny_model
from tests.support.sim_launch import request_json

PROMPT = " ".join(f"word{i % 50}" for i in range(300))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--io-backend", default="direct", choices=("direct", "kernel"))
    parser.add_argument("--timeout", type=float, default=420.0)
    args = parser.parse_args(argv)
    layout = "page_first_direct" if args.io_backend == "direct" else "page_first"
    folder = Path(tempfile.mkdtemp(prefix="pdkit-hicache-cpu-"))
    model = tiny_model(folder / "tiny-llama")
    master = PoolMaster(folder).start()
    extra = [
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "mooncake",
        "--page-size",
        "16",
        "--hicache-mem-layout",
        layout,
        "--hicache-io-backend",
        args.io_backend,
        "--hicache-write-policy",
        "write_through",
        "--hicache-storage-prefetch-policy",
        "wait_complete",
        "--enable-cache-report",
    ]
    server = RealServer(model, folder, extra)
    server.env |= master.env | {"MOONCAKE_GLOBAL_SEGMENT_SIZE": str(256 << 20)}
    print(f"argv: {' '.join(server.argv)}")
    started = time.monotonic()
    server.launch()
    try:
        while time.monotonic() - started < args.timeout:
            if not server.alive():
                print(f"the server exited after {time.monotonic() - started:.0f} s; log tail:")
                print("\n".join(server.log().splitlines()[-40:]))
                return 1
            with contextlib.suppress(OSError):
                if request_json(server.url + "/health", timeout_s=5)[0] == 200:
                    break
            time.sleep(1)
        else:
            print("no /health 200 in time; log tail:")
            print("\n".join(server.log().splitlines()[-40:]))
            return 1
        print(f"healthy after {time.monotonic() - started:.0f} s")
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        for attempt in ("first", "second (same prompt)", "third (after /flush_cache)"):
            if attempt.startswith("third"):
                print("flush_cache:", request_json(server.url + "/flush_cache", {})[0])
                time.sleep(2)
            status, answer = request_json(server.url + "/generate", body, timeout_s=120)
            meta = answer.get("meta_info", {}) if isinstance(answer, dict) else {}
            details = json.dumps(meta.get("cached_tokens_details"))
            print(
                f"{attempt}: HTTP {status}, prompt_tokens {meta.get('prompt_tokens')}, cached "
                f"{meta.get('cached_tokens')}, details {details}"
                + ("" if status == 200 else f", answer {str(answer)[:300]}")
            )
            time.sleep(1)
        pool = parse_metrics(master.metrics())
        print(
            f"master: {pool.total('master_key_count')} objects, "
            f"{pool.total('master_allocated_bytes')} bytes used of "
            f"{pool.total('master_total_capacity_bytes')}, "
            f"{pool.total('master_active_clients')} clients"
        )
        errors = [
            line for line in server.log().splitlines() if "rror" in line or "Traceback" in line
        ]
        print(f"{len(errors)} error lines in the server log" + (":" if errors else ""))
        print("\n".join(errors[-15:]))
        return 0
    finally:
        server.stop()
        master.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
