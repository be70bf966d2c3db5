"""`pdkit provision`: prepare the hosts of a topology with playbooks/provision.yml.

The inventory is the one `pdkit up` writes (same hosts, connections and layout); provisioning
adds per-host variables derived from the Plan (`provision_vars`, pure): which roles apply (no
GPU, RDMA or model work for engine sim or on a router-only host), the RDMA devices and GID index
the workers use, the GPUs the topology counts on, where the model comes from, and where the
Python environment's packages come from. pdkit itself always goes to the hosts as a wheel of
the control machine's pdkit (`kit.hosts.wheels`), so hosts run exactly the same code.

Roles: base (OS packages, locked-memory limit, huge pages), nvidia, rdma, python, model; each
can be skipped (`--skip`), and any role variable set with `-e NAME=VALUE`.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from kit.errors import DeployError
from kit.hosts.context import DeployContext, deployment_lock
from kit.hosts.inventory import DeployHost
from kit.hosts.playbook import PlaybookResult, failure_report, run_playbook
from kit.hosts.progress import AnsibleView
from kit.hosts.state_dir import display_path
from kit.hosts.transfer_check import measure_rails, raise_on_failed
from kit.hosts.wheels import PDKIT_DISTRIBUTION, pack_wheelhouse, pdkit_wheel, wheel_name
from kit.plan.router import SMG_REQUIREMENT
from kit.topology.nics import RDMA_BACKENDS
from kit.topology.plan_types import Plan

ROLES = ("base", "nvidia", "rdma", "python", "model")
"""Role tags of provision.yml, in the order they run."""

FP8_QUANTIZATIONS = ("fp8", "w8a8_fp8", "fbgemm_fp8", "modelopt_fp8")
"""--quantization values whose GEMMs SGLang runs with DeepGEMM (FP8 weights)."""

FACTS = ("pdkit_nvidia_facts", "pdkit_rdma_facts")
"""Facts provision.yml's roles set (`set_fact`) that pdkit shows after the run; the last value
a host reports wins."""


@dataclass(frozen=True)
class ProvisionOptions:
    """What `pdkit provision` was asked: a dry run (Ansible's check mode), the package source,
    skipped roles, and variables that override the roles' defaults (`-e`)."""

    dry_run: bool = False
    wheelhouse: Path | None = None
    """A folder of wheels or a tar archive of them; None: the hosts use a package index."""
    skip: tuple[str, ...] = ()
    extra_vars: Mapping[str, Any] = field(default_factory=dict)
    verbose: bool = False
    transfer_test: bool = False
    """Then move KV-sized buffers with Mooncake between every pair of worker hosts on every
    rail (kit.hosts.transfer_check)."""
    compile_deep_gemm: bool = False
    """Compile DeepGEMM's kernels for every single-node FP8 worker (`deep_gemm_workers`)."""


def fp8_model(plan: Plan) -> bool:
    """Whether the workers run FP8 weights, which SGLang's DeepGEMM kernels compile for: a
    --quantization fp8 flag, or a model path that says FP8 (DeepSeek-V3/R1 ship in FP8)."""
    path = plan.model.path.lower()
    if "fp8" in path or any(name in path for name in ("deepseek-v3", "deepseek-r1")):
        return True
    return any(
        flag[0] == "--quantization" and flag[1:] in {(q,) for q in FP8_QUANTIZATIONS}
        for worker in plan.workers
        for flag in worker.command.flags
    )


def deep_gemm_workers(plan: Plan, host: str) -> list[str]:
    """The workers on `host` whose DeepGEMM kernels `--compile-deep-gemm` compiles: rank 0 of
    each single-node GPU instance (a multi-node one compiles only with all its nodes up)."""
    return [
        w.name
        for w in plan.on_host(host)
        if w.nnodes == 1 and w.launch.device == "cuda" and plan.engine == "sglang"
    ]


def parse_extra_vars(pairs: Sequence[str]) -> dict[str, Any]:
    """`NAME=VALUE` strings -> variables; VALUE is read as YAML (true, 3, [a, b]) when it parses."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            raise DeployError(
                f"-e {pair!r}: expected NAME=VALUE, e.g. -e pdkit_base_install_packages=false."
            )
        try:
            out[name.strip()] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[name.strip()] = value
    return out


def check_deep_gemm(plan: Plan, skip: Sequence[str]) -> None:
    """`--compile-deep-gemm` needs an FP8 model on GPU workers and the python role."""
    if plan.engine != "sglang" or not fp8_model(plan):
        raise DeployError(
            f"--compile-deep-gemm: {plan.model.path} is not an FP8 model of engine sglang "
            "(--quantization fp8, a path naming FP8, DeepSeek-V3/R1), whose GEMMs SGLang runs "
            "with DeepGEMM. To fix: leave the flag out."
        )
    if "python" in skip:
        raise DeployError("--compile-deep-gemm runs in the python role: do not --skip python.")
    if not any(deep_gemm_workers(plan, h.name) for h in plan.hosts):
        raise DeployError(
            "--compile-deep-gemm: no single-node GPU worker to compile for (a multi-node "
            "instance compiles at its first start, with all its nodes up)."
        )


def check_skip(skip: Sequence[str]) -> tuple[str, ...]:
    unknown = [s for s in skip if s not in ROLES]
    if unknown:
        raise DeployError(f"--skip {', '.join(unknown)}: no such role. Roles: {', '.join(ROLES)}.")
    return tuple(skip)


def _model_source(plan: Plan) -> str:
    if plan.engine == "sim":
        return "none"
    return "path" if plan.model.path.startswith("/") else "hub"


def package_vars(plan: Plan) -> dict[str, Any]:
    """What the pinned SGLang needs installed (the Plan's `packages`, its dialect's): the
    Mooncake version, the Mooncake build when torch's CUDA cannot be read, and the oldest
    driver branch its torch's CUDA runs on."""
    packages = plan.packages
    if packages is None:
        return {}
    return {
        "pdkit_python_mooncake_version": packages.mooncake_version,
        "pdkit_python_mooncake_fallback_package": packages.mooncake_package,
        "pdkit_nvidia_min_driver_branch": packages.min_driver_branch,
        "pdkit_nvidia_cuda": packages.cuda,
    }


def provision_vars(
    plan: Plan,
    host: DeployHost,
    *,
    pdkit_wheel_path: Path | None,
    wheelhouse_archive: Path | None,
    compile_deep_gemm: bool = False,
) -> dict[str, Any]:
    """The provision.yml variables of one host (added to its inventory entry). Pure."""
    workers = plan.on_host(host.name)
    sim = plan.engine == "sim"
    devices = sorted({d for w in workers for d in w.rdma_devices})
    gid_index = next((w.gid_index for w in workers if w.gid_index is not None), None)
    out: dict[str, Any] = {
        "pdkit_provision_gpu_roles": bool(workers) and not sim,
        "pdkit_base_rdma_tools": not sim,
        # Triton compiles a C stub with gcc against Python.h at a worker's first launch.
        "pdkit_base_compilers": not sim,
        "pdkit_base_monitoring": plan.monitoring is not None and plan.monitoring.host == host.name,
        "pdkit_nvidia_expected_gpus": host.plan.gpus,
        # DeepEP's IBGDA needs the driver loaded with NVreg_EnableStreamMemOPs=1 and
        # PeerMappingOverride=1 (reference sglang-pd.md section 9).
        "pdkit_nvidia_require_ibgda": any(w.launch.moe_a2a_backend == "deepep" for w in workers),
        "pdkit_rdma_expected_devices": devices,
        "pdkit_rdma_required": plan.transfer_backend in RDMA_BACKENDS and bool(workers),
        # GPU memory is registered with the NIC only by real workers.
        "pdkit_rdma_require_gpudirect": plan.transfer_backend in RDMA_BACKENDS
        and bool(workers)
        and not sim,
        "pdkit_rdma_gid_index": "" if gid_index is None else str(gid_index),
        "pdkit_model_source": _model_source(plan) if workers else "none",
        "pdkit_model_path": plan.model.path,
        # Where `pdkit up` points the workers' HF_HOME (kit.hosts.inventory).
        "pdkit_model_hf_home": host.layout.hf_home,
        "pdkit_model_revision": plan.model.revision or "",
        "pdkit_python_sglang_version": plan.sglang_version,
        **package_vars(plan),
        # smg runs from the router host's venv (launch scripts put its bin/ first on PATH).
        "pdkit_python_router_packages": [SMG_REQUIREMENT]
        if plan.router.kind == "smg" and plan.runs_router(host.name)
        else [],
        "pdkit_python_nixl": plan.transfer_backend == "nixl" and bool(workers) and not sim,
        "pdkit_python_compile_deep_gemm": deep_gemm_workers(plan, host.name)
        if compile_deep_gemm
        else [],
    }
    if not host.local:
        # The venv whose python the deployment runs (DeployHost.python).
        out["pdkit_python_venv"] = host.layout.venv_dir
        out["pdkit_python_source"] = "wheelhouse" if wheelhouse_archive else "index"
        out["pdkit_python_wheelhouse"] = str(wheelhouse_archive or "")
        out["pdkit_python_pdkit_wheel"] = str(pdkit_wheel_path or "")
    return out


def provision_inventory(
    ctx: DeployContext,
    *,
    pdkit_wheel_path: Path | None,
    wheelhouse_archive: Path | None,
    extra_vars: Mapping[str, Any],
    compile_deep_gemm: bool = False,
) -> dict[str, Any]:
    """`pdkit up`'s inventory with every host's provisioning variables (`-e` ones last)."""
    inventory = ctx.inventory()
    hosts: dict[str, dict[str, Any]] = inventory["all"]["children"]["pdkit_hosts"]["hosts"]
    for host in ctx.hosts:
        hosts[host.name] |= provision_vars(
            ctx.plan,
            host,
            pdkit_wheel_path=pdkit_wheel_path,
            wheelhouse_archive=wheelhouse_archive,
            compile_deep_gemm=compile_deep_gemm,
        )
        hosts[host.name] |= dict(extra_vars)
    if pdkit_wheel_path is not None:
        inventory["all"]["vars"]["pdkit_python_pdkit_version"] = wheel_version(pdkit_wheel_path)
    return inventory


def _pdkit_wheel(wheelhouse: Path | None, work: Path) -> Path:
    """pdkit's wheel for the hosts: the one in the wheelhouse when it holds one (what the user
    chose to ship), else one made from this pdkit."""
    pattern = f"{wheel_name(PDKIT_DISTRIBUTION)}-*.whl"
    shipped: Path | None = None
    if wheelhouse is not None and wheelhouse.is_dir():
        shipped = max(wheelhouse.glob(pattern), default=None)
    elif wheelhouse is not None:
        shipped = _extract(wheelhouse, pattern, work / "dist")
    return shipped.absolute() if shipped else pdkit_wheel(work / "dist")


def _extract(archive: Path, pattern: str, folder: Path) -> Path | None:
    """The last member of a tar archive whose name matches `pattern`, written into `folder`."""
    with tarfile.open(archive) as tar:
        names = sorted(n for n in tar.getnames() if fnmatch(PurePosixPath(n).name, pattern))
        data = tar.extractfile(names[-1]) if names else None
        if data is None:
            return None
        content = data.read()
    target = folder / PurePosixPath(names[-1]).name
    if not (target.exists() and target.read_bytes() == content):
        folder.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return target


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (name-version-tags.whl)."""
    return wheel.name.split("-")[1]


def _wheelhouse_archive(wheelhouse: Path, work: Path) -> Path:
    if wheelhouse.is_dir():
        return pack_wheelhouse(wheelhouse, work / "wheelhouse.tar")
    if wheelhouse.is_file() and tarfile.is_tarfile(wheelhouse):
        return wheelhouse.absolute()
    raise DeployError(
        f"--wheelhouse {wheelhouse}: not a folder of wheels or a tar archive of them. To fix: "
        "build it first (docs/provisioning.md: air-gapped hosts), or use --index."
    )


@dataclass
class FactsCollector:
    """An AnsibleView listener that also keeps the facts called `names` each host set."""

    view: AnsibleView
    names: tuple[str, ...] = FACTS
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def listener(self, progress: Any, lines: list[str], event: Mapping[str, Any]) -> None:
        self.view.listener(progress, lines, event)
        data = event.get("event_data") or {}
        if event.get("event") != "runner_on_ok":
            return
        set_facts = (data.get("res") or {}).get("ansible_facts") or {}
        for name in self.names:
            value = set_facts.get(name)
            if isinstance(value, dict):
                self.facts.setdefault(str(data.get("host")), {})[name] = value


def provision(ctx: DeployContext, console: Console, options: ProvisionOptions) -> PlaybookResult:
    """Run provision.yml on every host of the topology; raise `DeployError` when it fails."""
    skip = check_skip(options.skip)
    if options.compile_deep_gemm:
        check_deep_gemm(ctx.plan, skip)
    work = ctx.state_dir / "provision"
    remote = [h for h in ctx.hosts if not h.local]
    python_role = "python" not in skip and bool(remote)
    archive = (
        _wheelhouse_archive(options.wheelhouse, work)
        if options.wheelhouse is not None and python_role
        else None
    )
    wheel = _pdkit_wheel(options.wheelhouse, work) if python_role else None
    inventory = provision_inventory(
        ctx,
        pdkit_wheel_path=wheel,
        wheelhouse_archive=archive,
        extra_vars=options.extra_vars,
        compile_deep_gemm=options.compile_deep_gemm,
    )
    cmdline = []
    if options.dry_run:
        cmdline.append("--check")
    if skip:
        cmdline += ["--skip-tags", ",".join(skip)]
    source = f"wheelhouse {display_path(archive)}" if archive else "package index"
    console.print(
        f"[bold]pdkit provision {escape(ctx.plan.name)}[/]: {len(ctx.hosts)} host(s), engine "
        f"{ctx.plan.engine}, Python packages from the {escape(source)}"
        + (" [bold](dry run: nothing is changed)[/]" if options.dry_run else "")
        + (f", skipping {', '.join(skip)}" if skip else "")
    )
    with deployment_lock(ctx), AnsibleView(console) as view:
        collector = FactsCollector(view)
        result = run_playbook(
            ctx.private_dir,
            inventory,
            "provision.yml",
            cmdline=" ".join(cmdline) or None,
            listener=collector.listener,
            verbose=options.verbose,
        )
    if not result.ok:
        raise DeployError(failure_report(result))
    _report(ctx, console, result, collector.facts, check=options.dry_run, work=work)
    if options.transfer_test:
        _transfer_test(ctx, console, collector.facts, check=options.dry_run)
    return result


def _transfer_test(
    ctx: DeployContext, console: Console, facts: dict[str, dict[str, Any]], *, check: bool
) -> None:
    if check:
        console.print("Transfer test: skipped in a dry run (it needs the provisioned venv).")
        return
    console.print(
        "[bold]Transfer test[/]: Mooncake writes between every pair of worker hosts, every rail"
    )
    results = measure_rails(ctx, facts)
    if not results:
        console.print("  one worker host: nothing to test between hosts.", markup=False)
    for line in (r.line() for r in results):
        console.print(f"  {line}", markup=False, highlight=False)
    raise_on_failed(results)


def _report(
    ctx: DeployContext,
    console: Console,
    result: PlaybookResult,
    facts: dict[str, dict[str, Any]],
    *,
    check: bool,
    work: Path,
) -> None:
    console.print(f"  {result.progress.summary()}", style="dim", markup=False)
    for host, found in sorted(facts.items()):
        for line in describe_facts(found):
            console.print(f"  {host}: {line}", markup=False)
    if facts:
        work.mkdir(parents=True, exist_ok=True)
        (work / "facts.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
    changed = sorted({c.host for c in result.progress.changes})
    if check:
        verdict = f"would change {', '.join(changed)}" if changed else "nothing would change"
    else:
        verdict = f"changed {', '.join(changed)}" if changed else "no change: already provisioned"
    console.print(f"Provisioned {ctx.plan.name}: {verdict}.", markup=False)


def describe_facts(found: Mapping[str, Any]) -> list[str]:
    """One line each for a host's GPU and RDMA facts."""
    lines = []
    gpu = found.get("pdkit_nvidia_facts")
    if gpu:
        names = sorted({g.get("name", "?") for g in gpu.get("gpus", [])})
        lines.append(
            f"{len(gpu.get('gpus', []))} GPU(s) {', '.join(names)}; driver "
            f"{gpu.get('driver_version') or '?'}, CUDA {gpu.get('cuda_version') or '?'}, "
            f"{gpu.get('nvswitches', 0)} NVSwitch(es)"
        )
    rdma = found.get("pdkit_rdma_facts")
    if rdma is not None:
        devices = []
        for device in rdma.get("devices", []):
            ports = device.get("ports", [])
            state = "/".join(p.get("state", "?") for p in ports) or "no port"
            layer = "/".join(sorted({p.get("link_layer", "") for p in ports} - {""}))
            devices.append(f"{device.get('name')} {state}{f' {layer}' if layer else ''}")
        lines.append(f"RDMA: {', '.join(devices) or 'no device'}")
    return lines
