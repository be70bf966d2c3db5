"""`pdkit doctor`'s KV pool check (topology `kv_pool:`): from each host whose workers use the
pool, a Mooncake Store client set up as those workers' (their MOONCAKE_* settings from the Plan)
reaches the master, puts a page, gets it back unchanged and removes it
(`poolprobe.py` in the playbooks' `roles/pdkit_check/files/`, sent to the host's Python on
stdin like kvprobe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.hosts.context import DeployContext
from kit.hosts.transfer_check import run_probe

PROBE = "poolprobe.py"
PAGE_BYTES = 256 * 1024
"""A page of the probe (a real one is page_size x kv_bytes_per_token: 8 MiB for Llama-3.1-8B
with 64 tokens in bf16); big enough to go through the transfer engine, quick on any link."""
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PoolCheck:
    host: str
    worker: str
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error

    def line(self) -> str:
        what = f"KV pool from {self.host} (as {self.worker})"
        if self.ok:
            return f"{what}: put and got a {PAGE_BYTES // 1024} KiB page in {self.seconds:.2f} s"
        return f"{what}: FAILED: {self.error}"


def _check(ctx: DeployContext, worker: str) -> PoolCheck:
    process = ctx.plan.process(worker)
    env = process.env
    host = next(h for h in ctx.hosts if h.name == process.host)
    args = ["--local-host", env["MOONCAKE_LOCAL_HOSTNAME"]]
    args += ["--metadata", env["MOONCAKE_TE_META_DATA_SERVER"], "--master", env["MOONCAKE_MASTER"]]
    args += ["--protocol", env["MOONCAKE_PROTOCOL"], "--page-bytes", str(PAGE_BYTES)]
    if env.get("MOONCAKE_DEVICE"):
        args += ["--device", env["MOONCAKE_DEVICE"]]
    run = run_probe(host, PROBE, args, TIMEOUT_S)
    if run is None:
        return PoolCheck(host.name, worker, f"no answer within {TIMEOUT_S:g} s")
    result = run.result or {}
    seconds = float(result.get("seconds", 0.0))
    if result.get("equal"):
        return PoolCheck(host.name, worker, seconds=seconds)
    if result.get("setup_rc", 0) != 0:
        error = f"the store client's setup returned {result['setup_rc']} (master unreachable?)"
    elif "put_rc" in result and result["put_rc"] != 0:
        error = f"put returned {result['put_rc']} (no segment with room, or a transfer failed)"
    elif "got" in result:
        error = f"the page came back {'changed' if result['got'] else 'empty'}"
    else:
        error = run.error
    return PoolCheck(host.name, worker, error, seconds)


def check_pool(ctx: DeployContext) -> list[PoolCheck]:
    """One check per host with pool clients (as its first client); none without `kv_pool:`."""
    pool = ctx.plan.kv_pool
    if pool is None:
        return []
    first: dict[str, str] = {}
    for name in pool.clients:
        first.setdefault(ctx.plan.process(name).host, name)
    return [_check(ctx, worker) for worker in first.values()]
