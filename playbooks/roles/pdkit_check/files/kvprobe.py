"""The host side of `pdkit provision --transfer-test`: the Mooncake transfer engine itself moving
a buffer between two hosts. Standalone (stdlib and mooncake only): pdkit sends this file to a
host's Python on stdin (`python - target ...`), the way Ansible sends a script.

    target    --host ADDR --protocol tcp|rdma [--device NIC] --size BYTES --serve-s S
              prints {"session": "ADDR:PORT", "addr": BUFFER, "size": BYTES}, then "alive" every
              second (it exits when nobody reads them any more, or after S seconds)
    initiator --host ADDR --protocol tcp|rdma [--device NIC] --size BYTES --rounds N
              --session ADDR:PORT --remote-addr BUFFER
              writes BYTES into the target's buffer N times; prints {"rc", "bytes", "seconds"}
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import sys
import time


def _engine(host: str, protocol: str, device: str, size: int) -> tuple[object, int, object]:
    from mooncake.engine import TransferEngine  # noqa: PLC0415 (a host's import, not pdkit's)

    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", protocol, device)
    if rc != 0:
        what = f"{host}, P2PHANDSHAKE, {protocol}, {device!r}"
        raise SystemExit(f"Mooncake initialize({what}) -> {rc}")
    buffer = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    rc = engine.register_memory(base, size)
    if rc != 0:
        raise SystemExit(f"Mooncake register_memory of {size} bytes -> {rc}")
    return engine, base, buffer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvprobe")
    parser.add_argument("mode", choices=("target", "initiator"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--protocol", default="tcp")
    parser.add_argument("--device", default="")
    parser.add_argument("--size", type=int, default=32 * 1024**2)
    parser.add_argument("--serve-s", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--session", default="")
    parser.add_argument("--remote-addr", type=int, default=0)
    args = parser.parse_args(argv)
    engine, base, buffer = _engine(args.host, args.protocol, args.device, args.size)
    if args.mode == "target":
        session = f"{args.host}:{engine.get_rpc_port()}"  # type: ignore[attr-defined]
        print(json.dumps({"session": session, "addr": base, "size": args.size}), flush=True)
        deadline = time.monotonic() + args.serve_s
        try:
            while time.monotonic() < deadline:
                time.sleep(1.0)
                print("alive", flush=True)
        except (BrokenPipeError, OSError):
            return 0
        return 0
    buffer[:] = bytes(range(256)) * (args.size // 256) + bytes(args.size % 256)  # type: ignore[index]
    started = time.perf_counter()
    rc = 0
    for _ in range(args.rounds):
        rc = engine.transfer_sync_write(  # type: ignore[attr-defined]
            args.session, base, args.remote_addr, args.size
        )
        if rc != 0:
            break
    seconds = time.perf_counter() - started
    moved = args.size * args.rounds if rc == 0 else 0
    print(json.dumps({"rc": rc, "bytes": moved, "seconds": seconds}), flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
