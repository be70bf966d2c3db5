"""The environment and flags real SGLang 0.5.23 needs on a CPU-only host, as smoke.py uses them:
kit's CPU profile (`kit/sglang/cpu.py`, the one copy, each entry with its reason and SGLang
file:line), shaped for a hand-started server on 127.0.0.1.

    python tools/sglang_cpu/cpu_profile.py --env     # `export` lines, each with its reason
    python tools/sglang_cpu/cpu_profile.py --flags   # the flags of every server

Runs under SGLang's own interpreter (.venv-sglang-cpu), which does not have pdkit installed:
`kit.sglang.cpu` needs nothing beyond the standard library, so the checkout's root goes on the
path.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kit.sglang import cpu

HOST = "127.0.0.1"
# The environment of pdkit's mooncake_tcp; smoke.py passes `mooncake` with it (MOONCAKE_PROTOCOL
# tcp), as SGLang's own PD tests do, where pdkit renders `mooncake_tcp` (the same transport).
TRANSFER = "mooncake_tcp"


def server_flags() -> list[str]:
    """Every server (colocated, prefill, decode), without --nccl-port (smoke picks one)."""
    return cpu.OWNED[cpu.DEVICE_FLAG].flag(cpu.DEVICE_FLAG) + cpu.argv("prefill")


def decode_flags() -> list[str]:
    """What a decode adds to `server_flags`."""
    return [arg for flag, s in cpu.DECODE_ARGS.items() for arg in s.flag(flag)]


def env() -> dict[str, str]:
    return {"SGLANG_HOST_IP": HOST, **cpu.env(HOST, TRANSFER)}


def main() -> None:
    if sys.argv[1:] == ["--env"]:
        why = cpu.ENV_WHY | {"SGLANG_HOST_IP": "the address prefill/decode advertise"}
        for name, value in env().items():
            print(f"export {name}={shlex.quote(value)}  # {why.get(name, '')}")
    elif sys.argv[1:] == ["--flags"]:
        print(" ".join(server_flags()))
    else:
        sys.exit("usage: cpu_profile.py --env | --flags")


if __name__ == "__main__":
    main()
