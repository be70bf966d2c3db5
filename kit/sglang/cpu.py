"""The flags and environment real SGLang 0.5.23 needs on a CPU host (`hosts[].device: cpu`), in
one place, each with its reason and the SGLang file:line it answers (paths under `sglang/` of
the 0.5.23 wheel). Measured on this project's machines: tools/sglang_cpu/MEASUREMENTS.md.

Three kinds of entry:
- `OWNED`: flags pdkit sets from the topology on a CPU host (`--device cpu`, the `--nccl-port`
  the Plan assigns); a user setting them in `args:` is told which key to set instead.
- `ARGS`, `DECODE_ARGS`: defaults, under the topology's `defaults.args` and the role's `args`
  (a user value wins key by key).
- `env`: the environment, under `transfer.env`, `defaults.env` and the role's `env`.

Pure data and functions of plain values: tools/sglang_cpu (run by SGLang's own interpreter,
without pdkit's dependencies) imports this module for its smoke run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One flag value or variable, and why a CPU host needs it."""

    value: str | bool
    why: str

    def flag(self, name: str) -> list[str]:
        """`--name value`, or the bare `--name` of a switch (value True)."""
        return [f"--{name}"] if self.value is True else [f"--{name}", str(self.value)]


DEVICE_FLAG = "device"
NCCL_PORT_FLAG = "nccl-port"

OWNED: dict[str, Setting] = {
    DEVICE_FLAG: Setting(
        "cpu",
        "no GPU: SGLang's CPU platform (srt/arg_groups/platform_hook.py:158 handle_cpu_backends)",
    ),
    NCCL_PORT_FLAG: Setting(
        "<the Plan's nccl_port>",
        "torch.distributed's rendezvous port; left unset, each server picks a free one at start "
        "(srt/server_args.py:771-773, srt/utils/network.py:205), so two servers starting "
        "together on one host can pick the same one",
    ),
}
"""Flags pdkit renders on every CPU host process (the values come from the Plan)."""

ARGS: dict[str, Setting] = {
    "attention-backend": Setting(
        "torch_native",
        "SGLang picks intel_amx on an x86 CPU (srt/arg_groups/platform_hook.py:166), which needs "
        "sgl-kernel's AMX ops; torch_native is pure torch",
    ),
    "cuda-graph-backend-decode": Setting(
        "disabled",
        "no CUDA graphs on CPU; 0.5.23's spelling (--disable-cuda-graph is deprecated: "
        "srt/server_args.py:411)",
    ),
    "cuda-graph-backend-prefill": Setting("disabled", "the same, for the prefill phase"),
    "mem-fraction-static": Setting(
        "0.5",
        "on CPU the budget is the host's free memory (srt/utils/common.py:490), measured "
        "before and after the weights load: the server refuses to start when free memory "
        "fell by more than 1 - this fraction meanwhile (srt/mem_cache/kv_cache_configurator.py"
        ":3043), which other servers starting beside it cause (0.05 failed at a 15% drop, "
        "measured here); --max-total-tokens, not this, bounds the KV pool",
    ),
    "max-total-tokens": Setting(
        "4096", "a small fixed KV pool: fast start and little memory (raise it for long prompts)"
    ),
    "sleep-on-idle": Setting(
        True,
        "an idle scheduler otherwise spins: 25-100% of a core per server, measured here on 2 "
        "cores (3 idle servers took more than one); with it the scheduler waits on its sockets "
        "when fully idle (srt/managers/scheduler.py:6160, scheduler_components/idle_sleeper.py:36)",
    ),
}
"""Every CPU host server (prefill and decode); the topology's args win."""

DECODE_ARGS: dict[str, Setting] = {
    "disaggregation-decode-retraction-backup": Setting(
        "cpu_tensor",
        "the default backup is a host pool that registers pinned memory with "
        "torch.cuda.cudart() (srt/mem_cache/pool_host/common.py:147)",
    ),
}
"""Decode servers on a CPU host; the topology's args win."""

ENV_WHY: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "select SGLang's CPU platform: is_cpu() is False without it "
    "(srt/utils/common.py:222, srt/platforms/__init__.py:50)",
    "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "the early send of a cached prefix "
    "records a torch.cuda.Event() (srt/disaggregation/prefill.py:1496; default on, "
    "srt/environ.py:768): off, else the prefill crashes on a prefix-cache hit",
    "MOONCAKE_PROTOCOL": "mooncake_tcp: Mooncake's TCP transport (MC_FORCE_TCP alone still "
    "initializes with protocol rdma: srt/distributed/device_communicators/"
    "mooncake_transfer_engine.py:209, srt/arg_groups/pd_disaggregation_hook.py:30)",
    "MC_TCP_BIND_ADDRESS": "mooncake_tcp: Mooncake's TCP listener binds the host's address",
    "MC_TCP_ENABLE_CONNECTION_POOL": "mooncake_tcp: as SGLang's own PD test fixture sets it "
    "(test/server_fixtures/disaggregation_fixture.py:64)",
    "NO_PROXY": "the decode fetches the prefill's bootstrap /route with requests, which honours "
    "HTTP proxy variables: keep the hosts' own addresses off any proxy",
    "no_proxy": "the same, for libraries that read the lower-case name",
}


def args(role: str) -> dict[str, str | bool]:
    """The default flags (no leading dashes; True: a bare switch) of a `role` server on a CPU
    host."""
    extra = DECODE_ARGS if role == "decode" else {}
    return {flag: s.value for flag, s in (ARGS | extra).items()}


def argv(role: str) -> list[str]:
    """`args(role)` as command-line arguments, for a server started by hand (tests, smoke)."""
    extra = DECODE_ARGS if role == "decode" else {}
    return [arg for flag, s in (ARGS | extra).items() for arg in s.flag(flag)]


def env(address: str, transfer_backend: str) -> dict[str, str]:
    """The environment of a server on a CPU host reached at bare `address`, moving KV with
    `transfer_backend`."""
    out = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}
    if transfer_backend == "mooncake_tcp":
        out |= {
            "MOONCAKE_PROTOCOL": "tcp",
            "MC_TCP_BIND_ADDRESS": address,
            "MC_TCP_ENABLE_CONNECTION_POOL": "true",
        }
    no_proxy = ",".join(dict.fromkeys([address, "127.0.0.1", "localhost"]))
    out |= {"NO_PROXY": no_proxy, "no_proxy": no_proxy}
    return out


def explain() -> list[tuple[str, str, str]]:
    """(kind, name, why) of every entry: flags as `--name value`, variables as `NAME`."""
    rows = [("flag", " ".join(s.flag(f)), s.why) for f, s in (OWNED | ARGS).items()]
    rows += [("decode flag", " ".join(s.flag(f)), s.why) for f, s in DECODE_ARGS.items()]
    rows += [("env", name, why) for name, why in ENV_WHY.items()]
    return rows
