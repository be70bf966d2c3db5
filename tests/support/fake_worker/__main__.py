"""`python -m tests.support.fake_worker`: fake SGLang PD workers in one process (see the package
doc)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
from collections.abc import Sequence

from kit.topology import ports
from tests.support.fake_worker.process import serve


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.support.fake_worker",
        description="Fake SGLang PD workers sharing one Ledger. Prints one JSON line with their "
        "URLs once all listen, and one with a summary when stopped (SIGTERM or SIGINT).",
    )
    p.add_argument("--prefills", type=int, default=1, help="prefill workers (default 1)")
    p.add_argument("--decodes", type=int, default=1, help="decode workers (default 1)")
    p.add_argument("--nulls", type=int, default=0, help="non-PD (null mode) workers (default 0)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=int, default=0, help="first port, the others follow (default 0: free ports)"
    )
    p.add_argument(
        "--bootstrap-port",
        type=int,
        default=ports.BOOTSTRAP,
        help=f"bootstrap port of the first prefill, the others follow (default {ports.BOOTSTRAP})",
    )
    p.add_argument("--token-delay", type=float, default=0.0, help="s between streamed tokens")
    p.add_argument("--latency", type=float, default=0.0, help="s before each answer")
    p.add_argument("--cpu", type=int, help="pin this process to one CPU")
    args = p.parse_args(argv)
    for flag in ("prefills", "decodes", "nulls"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must be 0 or more")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop  # noqa: PLC0415 - optional, a faster event loop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    counts = {"prefill": args.prefills, "decode": args.decodes, "null": args.nulls}
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        summary = runner.run(
            serve(
                counts,
                host=args.host,
                port=args.port,
                bootstrap_port=args.bootstrap_port,
                token_delay=args.token_delay,
                latency=args.latency,
            )
        )
    print(json.dumps(dataclasses.asdict(summary)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
