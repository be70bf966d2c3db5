"""The host side of `pdkit doctor`'s KV pool check: a Mooncake Store client on a worker's host,
set up as that worker's (its MOONCAKE_* settings), puts one page into the pool, gets it back,
compares it and removes it. Standalone (stdlib and mooncake only): pdkit sends this file to the
host's Python on stdin (`python - ARGS`), as it does kvprobe.py.

    --local-host ADDR --metadata URL --master HOST:PORT --protocol tcp|rdma [--device NICS]
    --page-bytes N
    prints {"setup_rc", "put_rc", "got", "equal", "seconds"} and exits 0 when the page came back
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

CLIENT_BUFFER = 16 * 1024 * 1024


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="poolprobe")
    parser.add_argument("--local-host", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--protocol", default="tcp")
    parser.add_argument("--device", default="")
    parser.add_argument("--page-bytes", type=int, default=65536)
    args = parser.parse_args(argv)
    from mooncake.store import MooncakeDistributedStore  # noqa: PLC0415 (the host's import)

    started = time.monotonic()
    store = MooncakeDistributedStore()
    # A client only (no global segment of its own): the page lands in the workers' segments.
    rc = store.setup(
        args.local_host, args.metadata, 0, CLIENT_BUFFER, args.protocol, args.device, args.master
    )
    result: dict[str, object] = {"setup_rc": rc}
    if rc == 0:
        key = f"pdkit-doctor-{os.getpid()}-{time.time_ns()}"
        page = os.urandom(args.page_bytes)
        result["put_rc"] = store.put(key, page)
        got = store.get(key)
        result |= {"got": len(got), "equal": got == page}
        store.remove(key)
        store.close()
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result), flush=True)
    return 0 if result.get("equal") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
