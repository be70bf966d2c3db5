"""The environment and flags real SGLang 0.5.23 needs on a CPU-only host, in one place.

Used by smoke.py; `python tools/sglang_cpu/cpu_profile.py --env` prints the environment as
shell `export` lines. Each entry says why it is there (file:line in SGLang 0.5.23).
"""

from __future__ import annotations

import shlex
import sys

# name -> (value, why)
ENV: dict[str, tuple[str, str]] = {
    "SGLANG_USE_CPU_ENGINE": (
        "1",
        "select SGLang's in-tree CPU platform, is_cpu() == True (srt/utils/common.py)",
    ),
    "SGLANG_HOST_IP": (
        "127.0.0.1",
        "the address prefill/decode advertise for bootstrap and KV transfer",
    ),
    "MOONCAKE_PROTOCOL": ("tcp", "Mooncake's TCP transport; no RDMA device here"),
    "MC_TCP_BIND_ADDRESS": ("127.0.0.1", "Mooncake's TCP listener on loopback only"),
    "MC_TCP_ENABLE_CONNECTION_POOL": ("true", "as SGLang's own PD test fixture sets it"),
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": (
        "0",
        "the early send of a cached prefix records torch.cuda.Event() "
        "(srt/disaggregation/prefill.py:1496): off, else the prefill crashes on a prefix-cache hit",
    ),
    "NO_PROXY": ("127.0.0.1,localhost", "keep loopback requests off any HTTP proxy"),
    "no_proxy": ("127.0.0.1,localhost", "the same, for libraries that read the lower-case name"),
}

# Every server (colocated, prefill, decode).
SERVER_FLAGS: list[tuple[list[str], str]] = [
    (["--device", "cpu"], "no GPU"),
    (
        ["--attention-backend", "torch_native"],
        "the pure-torch attention; the CPU backend (intel_amx) needs sgl-kernel's AMX ops",
    ),
    (
        ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
        "0.5.23's spelling for no CUDA graphs "
        "(--disable-cuda-graph is deprecated: srt/server_args.py:411)",
    ),
    (
        ["--mem-fraction-static", "0.05"],
        "the KV pool is sized from the host's memory on CPU; keep it small",
    ),
    (["--max-total-tokens", "4096"], "a small fixed KV pool: fast start, little memory"),
]
PD_FLAGS: list[tuple[list[str], str]] = [
    (
        ["--disaggregation-transfer-backend", "mooncake"],
        "Mooncake transfer engine (non-CUDA wheel) over TCP",
    ),
]
DECODE_FLAGS: list[tuple[list[str], str]] = [
    (
        ["--disaggregation-decode-retraction-backup", "cpu_tensor"],
        "the default backup is a host pool that calls torch.cuda.cudart() "
        "(srt/mem_cache/pool_host/common.py:147)",
    ),
]


def flags(*groups: list[tuple[list[str], str]]) -> list[str]:
    return [arg for group in groups for args, _why in group for arg in args]


def env() -> dict[str, str]:
    return {name: value for name, (value, _why) in ENV.items()}


def main() -> None:
    if sys.argv[1:] == ["--env"]:
        for name, (value, why) in ENV.items():
            print(f"export {name}={shlex.quote(value)}  # {why}")
    elif sys.argv[1:] == ["--flags"]:
        print(" ".join(flags(SERVER_FLAGS)))
    else:
        sys.exit("usage: cpu_profile.py --env | --flags")


if __name__ == "__main__":
    main()
