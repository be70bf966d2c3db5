"""`pdkit provision --check`: verify, read-only, what every host needs, item by item.

The items are the checklist of docs/provisioning.md (`ITEMS`, in its order): the OS, the NVIDIA
driver, a Python 3.11+ interpreter with its headers, gcc, a DeepGEMM compiler for FP8 models,
SGLang in the host's Python, the ports the Plan reserves, smg on the router host, nixl on the
worker hosts, the locked-memory limit, the RDMA devices with the GID index, GPUDirect RDMA, the
same SGLang, torch and Mooncake versions on every worker host, and (`kit.hosts.reach`) every
port a peer host must reach. `check_spec` (pure) says per host what playbooks/check.yml reads
there; `judge` (pure) turns what it read into one `CheckItem` each, `compare_versions` (pure)
compares the hosts; `check_hosts` runs the playbook over the same inventory and ansible-runner
path as provisioning and prints the table. `judge_all` is the whole verdict over the facts of
every host, callable without Ansible (a Slurm job step that ran the probes itself).

Each item ends in one of three verdicts: ok, *install* (missing, and `pdkit provision` installs
it: packages, the interpreter where apt may be used, SGLang, smg, nixl) and *fail* (the user
must act: the OS, the driver, nvcc, a port another process holds). The exit code is 1 when any
item fails, 2 when only what provisioning installs is missing, 0 when the hosts are ready.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.inventory import DeployHost
from kit.hosts.playbook import failure_report, run_playbook
from kit.hosts.progress import AnsibleView
from kit.hosts.provision import FactsCollector, fp8_model
from kit.hosts.reach import Reach, check_reach, fix
from kit.plan.router import SMG_REQUIREMENT
from kit.topology import ports
from kit.topology.nics import RDMA_BACKENDS
from kit.topology.plan_types import Plan, PortUse, WorkerProcess

Verdict = Literal["ok", "install", "fail"]

MOONCAKE_DISTRIBUTIONS = (
    "mooncake-transfer-engine",
    "mooncake-transfer-engine-cuda13",
    "mooncake-transfer-engine-non-cuda",
)
"""Mooncake's builds on PyPI (CUDA 12, CUDA 13, none): a host has one of them."""

ITEMS = (
    "OS",
    "NVIDIA driver",
    "Python 3.11+",
    "Python.h",
    "gcc",
    "DeepGEMM compiler",
    "SGLang",
    "ports",
    "smg",
    "nixl",
    "locked memory",
    "RDMA devices",
    "GPUDirect RDMA",
    "versions",
    "reachable ports",
)
"""The checklist's items, in the order docs/provisioning.md lists them."""

FACT = "pdkit_check_facts"
MIN_GLIBC = {"sglang": (2, 34), "sim": (2, 28)}
"""The glibc each engine's wheels need: SGLang 0.5.23's only wheel is manylinux_2_34 (its torch
2.14.1 manylinux_2_28); the sim's Mooncake build manylinux_2_28."""
MIN_DRIVER_BRANCH = 580
"""SGLang 0.5.23 pins torch 2.14.1, a CUDA 13 build (pdkit_nvidia_min_driver_branch)."""
NVRTC_ENV = "SGLANG_DG_USE_NVRTC"
PYTHON_CANDIDATES = ("python3", "python3.13", "python3.12", "python3.11")
"""pdkit_python's candidates (its defaults/main.yml)."""
COMPARED = ("sglang", "torch", *MOONCAKE_DISTRIBUTIONS)
"""Distributions whose versions must agree across the worker hosts (prefill and decode skew)."""


@dataclass(frozen=True)
class CheckItem:
    """One line of the table: on `host`, `item` needs `needed`, `found` was there."""

    host: str
    item: str
    needed: str
    found: str
    verdict: Verdict
    fix: str = ""


def _gpu_workers(plan: Plan, host: DeployHost) -> tuple[WorkerProcess, ...]:
    if plan.engine != "sglang" or host.plan.device != "cuda":
        return ()
    return plan.on_host(host.name)


def host_ports(plan: Plan, host: str) -> list[tuple[str, PortUse]]:
    """(process, port use) of every listener the Plan puts on `host`."""
    out = [(w.name, use) for w in plan.on_host(host) for use in w.ports]
    router = plan.router
    if plan.runs_router(host):
        out.append(
            (
                router.name,
                PortUse(first=router.port, last=router.port, what="HTTP", reached_by="clients"),
            )
        )
        if router.metrics_port:
            port = router.metrics_port
            out.append(
                (router.name, PortUse(first=port, last=port, what="metrics", reached_by="clients"))
            )
    monitoring = plan.monitoring
    if monitoring is not None and monitoring.host == host:
        port = monitoring.port
        out.append(
            (monitoring.name, PortUse(first=port, last=port, what="HTTP", reached_by="clients"))
        )
    return out


def _rdma_gpu_workers(plan: Plan, host: DeployHost) -> tuple[WorkerProcess, ...]:
    """The GPU workers on `host` that register GPU memory with a NIC (an RDMA backend)."""
    return _gpu_workers(plan, host) if plan.transfer_backend in RDMA_BACKENDS else ()


def _python(plan: Plan, host: DeployHost) -> str:
    """The interpreter the host's SGLang workers run with (sglang_python, else the venv's)."""
    return next((w.python for w in plan.on_host(host.name) if w.python), host.python)


def check_spec(plan: Plan, host: DeployHost, extra_vars: Mapping[str, Any]) -> dict[str, Any]:
    """What playbooks/check.yml reads on `host` (its pdkit_check_* variables). Pure."""
    workers = plan.on_host(host.name)
    interpreter = str(extra_vars.get("pdkit_python_interpreter", "auto"))
    if host.local:
        candidates = [host.python]
    else:
        candidates = list(PYTHON_CANDIDATES) if interpreter == "auto" else [interpreter]
    distributions = ["sglang"] if workers and plan.engine == "sglang" else []
    if distributions:
        distributions += [d for d in COMPARED if d != "sglang"]
    if workers and plan.transfer_backend == "nixl":
        distributions.append("nixl")
    executables = ["smg"] if plan.router.kind == "smg" and plan.runs_router(host.name) else []
    ranges = sorted({(use.first, use.last) for _, use in host_ports(plan, host.name)})
    gpu = bool(_gpu_workers(plan, host))
    gid_index = next((w.gid_index for w in workers if w.gid_index is not None), None)
    return {
        "pdkit_check_gpu": gpu,
        "pdkit_check_rdma": bool(_rdma_gpu_workers(plan, host)),
        "pdkit_check_spec": {
            "candidates": candidates,
            "python": _python(plan, host),
            "distributions": distributions,
            "executables": executables,
            "ports": [list(r) for r in ranges],
            "nvcc": gpu and fp8_model(plan),
            "gid_index": "" if gid_index is None else str(gid_index),
        },
    }


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _installs(extra_vars: Mapping[str, Any]) -> bool:
    """Whether provisioning may install OS packages (pdkit_base_install_packages)."""
    value = extra_vars.get("pdkit_base_install_packages", True)
    return value if isinstance(value, bool) else str(value).lower() in ("true", "1", "yes")


def judge(
    plan: Plan,
    host: DeployHost,
    facts: Mapping[str, Any],
    extra_vars: Mapping[str, Any] | None = None,
) -> list[CheckItem]:
    """The checklist items that apply to `host`, judged against what check.yml read. Pure."""
    extra = extra_vars or {}
    found: Mapping[str, Any] = facts.get("host") or {}
    items: list[CheckItem] = []
    name = host.name
    apt = _installs(extra) and not host.local

    def add(item: str, needed: str, seen: str, verdict: Verdict, fix: str = "") -> None:
        items.append(CheckItem(name, item, needed, seen, verdict, fix))

    system = found.get("os") or {}
    glibc = str(system.get("glibc") or "")
    seen = ", ".join(
        p
        for p in (system.get("pretty_name"), system.get("machine"), glibc and f"glibc {glibc}")
        if p
    )
    os_ok = system.get("system") == "Linux" and system.get("machine") == "x86_64"
    floor = MIN_GLIBC[plan.engine]
    least = ".".join(map(str, floor))
    os_ok = os_ok and _version(glibc) >= floor
    add(
        "OS",
        f"Linux x86_64, glibc {least}+ (manylinux_{least.replace('.', '_')} wheels)",
        seen or "?",
        "ok" if os_ok else "fail",
        ""
        if os_ok
        else f"use a Linux x86_64 host with glibc {least} or newer (Ubuntu 22.04/24.04, Debian 12)",
    )

    gpu_workers = _gpu_workers(plan, host)
    if gpu_workers:
        items.append(_driver(name, facts.get("nvidia"), host.plan.gpus, extra))

    interpreter = found.get("interpreter")
    tried = ", ".join(found.get("interpreters_tried") or []) or "none found"
    if interpreter:
        add(
            "Python 3.11+",
            "an interpreter for the venv",
            f"{interpreter['path']} {interpreter['version']}",
            "ok",
        )
    elif apt:
        add(
            "Python 3.11+",
            "an interpreter for the venv",
            tried,
            "install",
            "pdkit provision installs python3.11 python3.11-venv python3.11-dev",
        )
    else:
        add(
            "Python 3.11+",
            "an interpreter for the venv",
            tried,
            "fail",
            "install python3.11 python3.11-venv python3.11-dev (Ubuntu 22.04: universe), or "
            "-e pdkit_python_interpreter=/path/to/python3.11",
        )

    if gpu_workers or (plan.engine == "sglang" and plan.on_host(name)):
        headers = bool(interpreter and interpreter.get("headers"))
        add(
            "Python.h",
            "the interpreter's headers (Triton compiles a stub at first launch)",
            "present" if headers else "missing",
            "ok" if headers else ("install" if apt else "fail"),
            "" if headers else "apt-get install python3.11-dev (the interpreter's -dev package)",
        )
        gcc = found.get("gcc")
        add(
            "gcc",
            "a C compiler (Triton)",
            f"gcc {gcc['version']}" if gcc else "missing",
            "ok" if gcc else ("install" if apt else "fail"),
            "" if gcc else "apt-get install gcc",
        )

    if gpu_workers and fp8_model(plan):
        nvcc = found.get("nvcc")
        nvrtc = [w.name for w in gpu_workers if w.env.get(NVRTC_ENV) == "1"]
        if nvcc:
            seen, ok = f"nvcc {nvcc['version']} ({nvcc['path']})", True
        elif len(nvrtc) == len(gpu_workers):
            seen, ok = f"{NVRTC_ENV}=1 in every worker's env", True
        else:
            seen, ok = "no nvcc, and NVRTC not chosen", False
        add(
            "DeepGEMM compiler",
            f"nvcc, or {NVRTC_ENV}=1 (FP8 model)",
            seen,
            "ok" if ok else "fail",
            ""
            if ok
            else f"install the CUDA 13 nvcc (cuda-nvcc-13-0), or set {NVRTC_ENV}: '1' in "
            "the roles' env",
        )

    python = found.get("python") or {}
    distributions = python.get("distributions") or {}
    if "sglang" in check_spec(plan, host, extra)["pdkit_check_spec"]["distributions"]:
        have = distributions.get("sglang")
        want = plan.sglang_version
        where = python.get("path", "")
        add(
            "SGLang",
            f"sglang=={want} in {where}",
            f"sglang {have}" if have else "not installed",
            "ok" if have == want else "install",
            "" if have == want else "pdkit provision installs it",
        )

    items.append(_ports(plan, host, found.get("listening") or []))

    executables = python.get("executables") or {}
    if plan.router.kind == "smg" and plan.runs_router(name):
        path = executables.get("smg") or ""
        add(
            "smg",
            f"{SMG_REQUIREMENT} (router.kind smg)",
            path or "not found",
            "ok" if path else "install",
            "" if path else "pdkit provision installs it",
        )
    if plan.on_host(name) and plan.transfer_backend == "nixl":
        have = distributions.get("nixl")
        add(
            "nixl",
            "nixl for torch's CUDA (transfer.backend nixl)",
            f"nixl {have}" if have else "not installed",
            "ok" if have else "install",
            "" if have else "pdkit provision installs it",
        )
    if plan.on_host(name) and plan.engine == "sglang" and plan.transfer_backend in RDMA_BACKENDS:
        items.append(_memlock(host, found.get("memlock")))
    if _rdma_gpu_workers(plan, host):
        items += _rdma(plan, host, facts.get("rdma") or {})
    return items


def _memlock(host: DeployHost, limit: Mapping[str, Any] | None) -> CheckItem:
    """The NIC pins (registers) the KV buffers: the workers need an unlimited locked-memory
    limit. systemd units set LimitMEMLOCK=infinity; a supervisord launch script raises its own
    limit with `ulimit -l unlimited`, which works below an unlimited hard limit or as root with
    CAP_SYS_RESOURCE (not in most containers)."""
    needed = "unlimited for the workers (Mooncake registers the KV buffers with the NIC)"
    if host.plan.service_manager == "systemd":
        return CheckItem(host.name, "locked memory", needed, "LimitMEMLOCK=infinity (unit)", "ok")

    def shown(value: Any) -> str:
        return "unlimited" if int(value) < 0 else f"{int(value) // 1024} KiB"

    if not limit:
        return CheckItem(host.name, "locked memory", needed, "not read", "fail", _MEMLOCK_FIX)
    seen = f"ulimit -l {shown(limit['soft'])} (hard {shown(limit['hard'])})"
    if int(limit["hard"]) < 0 or limit.get("raisable"):
        return CheckItem(host.name, "locked memory", needed, seen + ", can be raised", "ok")
    return CheckItem(
        host.name, "locked memory", needed, seen + ", cannot be raised", "fail", _MEMLOCK_FIX
    )


_MEMLOCK_FIX = (
    "raise the hard locked-memory limit to unlimited for the user that starts the workers: "
    "`pdkit provision T` writes /etc/security/limits.d/90-pdkit-memlock.conf (new SSH sessions "
    "with PAM get it: log in again), or `--ulimit memlock=-1:-1` for a container; otherwise "
    'Mooncake fails with "Failed to register memory ... Cannot allocate memory"'
)


def _rdma(plan: Plan, host: DeployHost, rdma: Mapping[str, Any]) -> list[CheckItem]:
    """The topology's RDMA devices exist with an ACTIVE port and the GID index; GPUDirect RDMA
    (nvidia_peermem loaded, or dma-buf) lets the NIC register GPU memory."""
    name = host.name
    workers = plan.on_host(name)
    wanted = sorted({d for w in workers for d in w.rdma_devices})
    gid_index = next((w.gid_index for w in workers if w.gid_index is not None), None)
    devices = [str(d.get("name")) for d in rdma.get("devices") or []]
    active = set(rdma.get("active_devices") or [])
    with_gid = set(rdma.get("devices_with_gid_index") or [])
    problems = [f"{d} missing" for d in wanted if d not in devices]
    problems += [f"{d} has no ACTIVE port" for d in wanted if d in devices and d not in active]
    if gid_index is not None:
        problems += [f"{d} has no GID {gid_index}" for d in wanted if d in active - with_gid]
    needed = f"{', '.join(wanted) or 'a device'} ACTIVE" + (
        f", GID index {gid_index}" if gid_index is not None else ""
    )
    if not wanted and not devices:
        problems.append("no RDMA device")
    items = [
        CheckItem(
            name,
            "RDMA devices",
            needed,
            "; ".join(problems) + f" (host has: {', '.join(devices) or 'none'})"
            if problems
            else f"{', '.join(sorted(active))} ACTIVE",
            "fail" if problems else "ok",
            "correct hosts[].rdma_devices / gpu_nics and transfer.gid_index (`pdkit discover T` "
            "proposes them from what the host has), or bring the link up"
            if problems
            else "",
        )
    ]
    direct = rdma.get("gpudirect") or {}
    if direct.get("nvidia_peermem"):
        seen = "nvidia_peermem loaded"
    elif direct.get("dmabuf"):
        seen = f"dma-buf ({direct.get('kernel')}, open kernel modules)"
    else:
        seen = (
            f"nvidia_peermem not loaded, no dma-buf (driver: {direct.get('driver') or 'none'}; "
            f"kernel {direct.get('kernel') or '?'})"
        )
    ok = bool(direct.get("nvidia_peermem") or direct.get("dmabuf"))
    items.append(
        CheckItem(
            name,
            "GPUDirect RDMA",
            "nvidia_peermem, or dma-buf (the NIC registers GPU memory)",
            seen,
            "ok" if ok else "fail",
            ""
            if ok
            else "`modprobe nvidia_peermem` and list it in /etc/modules-load.d/, or use NVIDIA's "
            "open kernel modules on Linux 5.12+ (dma-buf); otherwise Mooncake fails with "
            '"Failed to register memory ... Bad address"',
        )
    )
    return items


def compare_versions(plan: Plan, facts_by_host: Mapping[str, Mapping[str, Any]]) -> list[CheckItem]:
    """One "versions" item per worker host when the worker hosts run different versions of
    SGLang, torch or Mooncake (`COMPARED`); a host in the minority (or every host of a tie)
    fails, naming the others' versions. Nothing when fewer than two hosts run workers. Pure."""
    hosts = [h.name for h in plan.hosts if plan.on_host(h.name) and h.name in facts_by_host]
    if len(hosts) < 2:
        return []
    found: dict[str, dict[str, str]] = {}
    for host in hosts:
        python = (facts_by_host[host].get("host") or {}).get("python") or {}
        have = python.get("distributions") or {}
        found[host] = {d: str(have[d]) for d in COMPARED if have.get(d)}
    odd: dict[str, list[str]] = {host: [] for host in hosts}
    for dist in COMPARED:
        by_version: dict[str, list[str]] = {}
        for host in hosts:
            if dist in found[host]:
                by_version.setdefault(found[host][dist], []).append(host)
        if len(by_version) < 2:
            continue
        most = max(len(v) for v in by_version.values())
        majority = [v for v, h in by_version.items() if len(h) == most]
        for version, holders in by_version.items():
            if len(majority) == 1 and version == majority[0]:
                continue
            others = "; ".join(
                f"{', '.join(h)}: {v}" for v, h in sorted(by_version.items()) if v != version
            )
            for host in holders:
                odd[host].append(f"{dist} {version} ({others})")
    items = []
    for host in hosts:
        shown = ", ".join(f"{d} {v}" for d, v in found[host].items()) or "none found"
        if odd[host]:
            items.append(
                CheckItem(
                    host,
                    "versions",
                    "the same SGLang, torch and Mooncake on every worker host",
                    "; ".join(odd[host]),
                    "fail",
                    f"install the same versions everywhere: `pdkit provision T` installs "
                    f"sglang=={plan.sglang_version} with its pins on every host (or point every "
                    "host's sglang_python at equal environments)",
                )
            )
        else:
            items.append(
                CheckItem(
                    host,
                    "versions",
                    "the same SGLang, torch and Mooncake on every worker host",
                    shown,
                    "ok",
                )
            )
    return items


def reach_items(results: Sequence[Reach]) -> list[CheckItem]:
    """One "reachable ports" item per host that must reach another host's ports. Pure."""
    items = []
    for source in dict.fromkeys(r.route.source for r in results):
        mine = [r for r in results if r.route.source == source]
        failed = [r for r in mine if not r.ok]
        needed = f"{len(mine)} port(s) on other hosts (bootstrap, dist-init)"
        if not failed:
            items.append(CheckItem(source, "reachable ports", needed, "all reached", "ok"))
            continue
        items.append(
            CheckItem(
                source,
                "reachable ports",
                needed,
                "; ".join(
                    f"{r.route.target} {r.route.port} ({r.route.process} {r.route.what}) {r.state}"
                    for r in failed
                ),
                "fail",
                "; ".join(dict.fromkeys(fix(r) for r in failed)),
            )
        )
    return items


def judge_all(
    plan: Plan,
    hosts: Sequence[DeployHost],
    facts_by_host: Mapping[str, Mapping[str, Any]],
    extra_vars: Mapping[str, Any] | None = None,
) -> list[CheckItem]:
    """Every host's items (`judge`) and the comparison across hosts (`compare_versions`), in
    host order. Pure: what `pdkit provision --check` prints, for any caller that gathered the
    facts (Ansible's check.yml, or a launcher that ran the probes as a job step)."""
    versions = {i.host: i for i in compare_versions(plan, facts_by_host)}
    items: list[CheckItem] = []
    for host in hosts:
        items += judge(plan, host, facts_by_host[host.name], extra_vars)
        if host.name in versions:
            items.append(versions[host.name])
    return items


def _driver(
    host: str, nvidia: Mapping[str, Any] | None, gpus: int, extra: Mapping[str, Any]
) -> CheckItem:
    floor = int(extra.get("pdkit_nvidia_min_driver_branch", MIN_DRIVER_BRANCH))
    needed = f"branch {floor}+ (torch 2.14.1, CUDA 13), {gpus} GPU(s)"
    if not nvidia or not nvidia.get("ok"):
        error = (nvidia or {}).get("error") or "no answer"
        return CheckItem(
            host,
            "NVIDIA driver",
            needed,
            f"nvidia-smi fails: {error}",
            "fail",
            "install the NVIDIA driver (580 branch or newer) and reboot",
        )
    branch = int(str(nvidia.get("driver_branch") or "0") or 0)
    count = len(nvidia.get("gpus") or [])
    seen = (
        f"{nvidia.get('driver_version')} (CUDA {nvidia.get('cuda_version') or '?'}), {count} GPU(s)"
    )
    fix = ""
    if branch < floor:
        fix = f"install the {floor} driver (nvidia-driver-{floor}-server) and reboot"
    elif count < gpus:
        fix = "correct hosts[].gpus, or check the host (nvidia-smi -L)"
    if fix:
        return CheckItem(host, "NVIDIA driver", needed, seen, "fail", fix)
    return CheckItem(host, "NVIDIA driver", needed, seen, "ok")


def _ports(plan: Plan, host: DeployHost, listening: Sequence[Mapping[str, Any]]) -> CheckItem:
    """The Plan's ports on the host are free or held by this deployment's own processes;
    Mooncake's RPC range needs only one free port per process."""
    uses = host_ports(plan, host.name)
    rpc = (ports.MOONCAKE_RPC.start, ports.MOONCAKE_RPC.stop - 1)
    conflicts = []
    for process, use in uses:
        if (use.first, use.last) == rpc:
            continue
        for entry in listening:
            if use.first <= int(entry["port"]) <= use.last and entry.get("deployment") != plan.name:
                holder = (
                    f"pid {entry['pid']} ({entry.get('command') or '?'})"
                    if entry.get("pid")
                    else "an unknown process"
                )
                conflicts.append(f"{entry['port']} ({process} {use.what}) held by {holder}")
    others = {int(e["port"]) for e in listening if e.get("deployment") != plan.name}
    free_rpc = sum(1 for p in range(rpc[0], rpc[1] + 1) if p not in others)
    needs_rpc = sum(1 for _, use in uses if (use.first, use.last) == rpc)
    if needs_rpc and free_rpc < needs_rpc:
        conflicts.append(f"Mooncake's RPC range {rpc[0]}-{rpc[1]} has {free_rpc} free port(s)")
    count = sum(1 for _, use in uses if (use.first, use.last) != rpc)
    needed = f"{count} port(s) of the Plan free" + (
        ", Mooncake RPC range open" if needs_rpc else ""
    )
    if conflicts:
        return CheckItem(
            host.name,
            "ports",
            needed,
            "; ".join(conflicts),
            "fail",
            "stop what holds them, or move the ports in the topology "
            "(pdkit render --json lists workers[].ports)",
        )
    ours = sum(1 for e in listening if e.get("deployment") == plan.name)
    seen = "free" + (f" ({ours} held by this deployment)" if ours else "")
    return CheckItem(host.name, "ports", needed, seen, "ok")


def exit_code(items: Sequence[CheckItem]) -> int:
    """1: something the user must fix; 2: only what `pdkit provision` installs is missing."""
    verdicts = {i.verdict for i in items}
    return 1 if "fail" in verdicts else 2 if "install" in verdicts else 0


VERDICT_TEXT = {"ok": "ok", "install": "provision installs", "fail": "FAIL"}


def table(items: Sequence[CheckItem]) -> list[str]:
    """The checklist as aligned text lines: host, item, needed, found, verdict."""
    rows = [("host", "item", "needs", "found", "verdict")]
    rows += [(i.host, i.item, i.needed, i.found, VERDICT_TEXT[i.verdict]) for i in items]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    return [
        "  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row[:4])) + "  " + row[4]
        for row in rows
    ]


def check_hosts(
    ctx: DeployContext,
    console: Console,
    extra_vars: Mapping[str, Any],
    *,
    verbose: bool = False,
) -> int:
    """Run check.yml on every host, print the checklist table and what to fix; the exit code
    (`exit_code`)."""
    console.print(
        f"[bold]pdkit provision {escape(ctx.plan.name)} --check[/]: {len(ctx.hosts)} host(s) "
        "(Ansible, check.yml: read-only)"
    )
    inventory = ctx.inventory()
    hosts: dict[str, dict[str, Any]] = inventory["all"]["children"]["pdkit_hosts"]["hosts"]
    for host in ctx.hosts:
        hosts[host.name] |= check_spec(ctx.plan, host, extra_vars) | dict(extra_vars)
    with AnsibleView(console) as view:
        collector = FactsCollector(view, names=(FACT,))
        result = run_playbook(
            ctx.private_dir, inventory, "check.yml", listener=collector.listener, verbose=verbose
        )
    if not result.ok:
        raise DeployError(failure_report(result))
    facts_by_host = {}
    for host in ctx.hosts:
        facts = collector.facts.get(host.name, {}).get(FACT)
        if facts is None:
            raise DeployError(f"check.yml returned no facts for {host.name}.")
        facts_by_host[host.name] = facts
    items = judge_all(ctx.plan, ctx.hosts, facts_by_host, extra_vars)
    items += reach_items(check_reach(ctx.plan, ctx.hosts_by_name))
    work = ctx.state_dir / "provision"
    work.mkdir(parents=True, exist_ok=True)
    (work / "check.json").write_text(
        json.dumps({h: collector.facts[h][FACT] for h in collector.facts}, indent=2) + "\n"
    )
    for line in report(ctx.plan.name, items):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return exit_code(items)


VERDICTS = {
    0: "every host has what it needs",
    1: "some items need fixing by hand (FAIL above)",
    2: "pdkit provision installs what is missing",
}


def report(
    name: str, items: Sequence[CheckItem], verdicts: Mapping[int, str] = VERDICTS
) -> list[str]:
    """What `pdkit provision --check` prints: the table, each item's fix, and the verdict
    (`verdicts` by exit code)."""
    lines = table(items)
    lines += [f"  {i.host}: {i.item}: {i.fix}." for i in items if i.verdict != "ok"]
    return [*lines, f"Checked {name}: {verdicts[exit_code(items)]}."]
