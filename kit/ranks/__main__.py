"""``python -m kit.ranks --leader HOST:PORT --node-rank R --nnodes N -- COMMAND...``: run one
rank of a multi-node instance as a member of its group (`kit.ranks.group`).

Exit codes: 0 after SIGTERM/SIGINT (the rank's process stopped first), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from kit.ranks.group import GroupSettings, run_rank


def parse(argv: Sequence[str]) -> tuple[GroupSettings, list[str]]:
    """The group's settings and the rank's command (after ``--``)."""
    parser = argparse.ArgumentParser(prog="python -m kit.ranks", description=__doc__)
    parser.add_argument("--leader", required=True, help="host:port of node rank 0's agent")
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--restart-delay", type=float, default=2.0, help="seconds, doubling")
    parser.add_argument("--stop-timeout", type=float, default=50.0, help="seconds to SIGKILL")
    argv = list(argv)
    if "--" not in argv:
        parser.error("the rank's command follows --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("the rank's command follows --")
    if not 0 <= args.node_rank < args.nnodes or args.nnodes < 2:
        parser.error("--node-rank must be below --nnodes, and --nnodes at least 2")
    settings = GroupSettings(
        leader=args.leader,
        node_rank=args.node_rank,
        nnodes=args.nnodes,
        restart_delay_s=args.restart_delay,
        stop_timeout_s=args.stop_timeout,
    )
    return settings, command


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rank until SIGTERM or SIGINT; returns the exit code."""
    settings, command = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="[%(asctime)s] pdkit rank group: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )

    async def serve() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await run_rank(settings, command, stopping)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
