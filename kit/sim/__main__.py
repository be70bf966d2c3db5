"""``python -m kit.sim ARGV``: run an emulated SGLang worker with launch_server's ARGV.

Exit codes: 0 after SIGTERM/SIGINT, 1 when the worker cannot start (model does not fit, port
in use, Mooncake fails), 2 for bad arguments or ``PDKIT_SIM_*`` values.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from kit.aio import run
from kit.perf.models import ModelConfigError
from kit.sim.args import ArgsError, parse_args
from kit.sim.engine import StartupError
from kit.sim.settings import SimSettings
from kit.sim.worker import run_worker
from kit.topology.sim_env import SettingsError


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, configure logging, and serve until a signal; returns the exit code."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        settings = SimSettings.from_env(os.environ)
    except (ArgsError, SettingsError) as exc:
        print(exc, file=sys.stderr)
        return 2
    level = (settings.log_level or args.log_level).upper()
    # SGLang's own log format (srt/utils/common.py:2630): the lines pdkit matches read alike.
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    if args.ignored:
        logging.getLogger("kit.sim").info(
            "sim: accepted without effect: %s", " ".join(args.ignored)
        )
    return run(_serve(args, settings))


async def _serve(args: object, settings: SimSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_worker(args, settings, stop)  # type: ignore[arg-type]
    except (StartupError, ModelConfigError, OSError) as exc:
        logging.getLogger("kit.sim").error("sim: cannot start: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
