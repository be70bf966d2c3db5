"""Topology + placement -> Plan: the argv and environment of every process. Pure: no I/O, no
clock, no randomness; the same topology always renders byte-identical output.

Flag rendering: pdkit's own flags first in a fixed order, then the user's `args` sorted by
name; `_` -> `-`; `true` -> bare flag; `false`/`null` -> nothing; a list -> flag then items.
"""

from __future__ import annotations

import json
from pathlib import Path

from kit.net import bare_host, host_port
from kit.sglang.monitoring import build_monitoring
from kit.topology.layout import ROUTER_PROCESS, HostLayout, host_root, process_name, unit_name
from kit.topology.nics import NicChoice, choose_nics
from kit.topology.place import InstancePlacement, Node, place
from kit.topology.plan import (
    Command,
    HostPlan,
    ModelPlan,
    Parallelism,
    Plan,
    RouterProcess,
    WorkerProcess,
)
from kit.topology.policies import DEFAULT_POLICIES
from kit.topology.schema import ArgValue, Host, Role, Topology

SGLANG_MODULE = "sglang.launch_server"
SIM_MODULE = "kit.sim"
LB_MODULE = "kit.lb"
SMG_EXECUTABLE = "smg"
ROUTER_API_KEY_ENV = "PDKIT_ROUTER_API_KEY"
"""The variable that holds the router's client API key on the router host (env file 0600)."""

UCX_PORT = 1
"""The HCA port NIXL's UCX uses (SGLang appends port 1 to --disaggregation-ib-device too)."""

PDKIT_DEFAULT_ARGS: dict[str, ArgValue] = {"enable-metrics": True}
"""Flags pdkit adds unless the topology sets them: status reads /metrics."""


def normalize_flag(name: str) -> str:
    """'chunked_prefill_size', '--chunked-prefill-size' -> 'chunked-prefill-size'."""
    return name.lstrip("-").replace("_", "-")


def role_args(topology: Topology, role: str) -> dict[str, ArgValue]:
    """The user's args for a role: pdkit defaults < defaults.args < role.args, normalized."""
    spec: Role = getattr(topology, role)
    merged: dict[str, ArgValue] = {}
    for source in (PDKIT_DEFAULT_ARGS, topology.defaults.args, spec.args):
        for key, value in source.items():
            merged[normalize_flag(key)] = value
    return merged


def render_args(args: dict[str, ArgValue]) -> list[str]:
    """Sorted flags; see the module docstring for the value rules."""
    out: list[str] = []
    for key in sorted(args):
        value = args[key]
        if value is None or value is False:
            continue
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            out += [flag, *(_scalar(v) for v in value)]
        else:
            out += [flag, _scalar(value)]
    return out


def _scalar(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def ib_device(choice: NicChoice | None) -> str | None:
    """The --disaggregation-ib-device value for a process's RDMA devices, or None (no RDMA, or
    Mooncake's own discovery): a per-GPU JSON map, else a comma list."""
    if choice is None:
        return None
    if choice.mode == "per_gpu":
        mapping = {str(g): nic for g, nic in choice.per_gpu.items()}
        return json.dumps(mapping, separators=(",", ":")) if mapping else None
    return ",".join(choice.devices) or None


def ucx_net_devices(topology: Topology, choice: NicChoice | None) -> str | None:
    """UCX_NET_DEVICES of a NIXL process that uses one RDMA device (``mlx5_0:1``), else None.

    A process with several devices keeps the per-GPU map in --disaggregation-ib-device, which
    SGLang 0.5.23 hands NIXL's UCX backend GPU by GPU (`device_list`); with UCX_NET_DEVICES set
    it would ignore that map ("Per-GPU CLI device mappings will not be applied")."""
    if topology.transfer.backend != "nixl" or choice is None or len(choice.devices) != 1:
        return None
    return f"{choice.devices[0]}:{UCX_PORT}"


def worker_env(
    topology: Topology, role: str, host: Host, ucx_devices: str | None = None
) -> dict[str, str]:
    spec: Role = getattr(topology, role)
    env: dict[str, str] = {}
    if topology.engine == "sim" and host.gpu_type:
        env["PDKIT_SIM_GPU"] = host.gpu_type
    # The address the transfer engine advertises to its peers.
    env["SGLANG_HOST_IP"] = bare_host(host.address)
    gid_index = topology.transfer.gid_index
    if gid_index is not None:
        name = "UCX_IB_GID_INDEX" if topology.transfer.backend == "nixl" else "MC_GID_INDEX"
        env[name] = str(gid_index)
    if ucx_devices:
        env["UCX_NET_DEVICES"] = ucx_devices
    env.update(topology.transfer.env)
    env.update(topology.defaults.env)
    env.update(spec.env)
    return dict(sorted(env.items()))


def worker_args(
    topology: Topology, p: InstancePlacement, node: Node, device: str | None
) -> list[str]:
    spec: Role = getattr(topology, p.role)
    host = topology.host(node.host)
    model = topology.model
    args = ["--model-path", model.path]
    if model.served_name:
        args += ["--served-model-name", model.served_name]
    if model.revision:
        args += ["--revision", model.revision]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--host", bind_address(spec, host), "--port", str(p.http_port)]
    args += ["--disaggregation-mode", p.role]
    if p.bootstrap_port is not None:
        args += ["--disaggregation-bootstrap-port", str(p.bootstrap_port)]
    args += ["--disaggregation-transfer-backend", topology.transfer.backend]
    if device:
        args += ["--disaggregation-ib-device", device]
    args += ["--tp-size", str(spec.tp)]
    if spec.dp > 1:
        args += ["--dp-size", str(spec.dp)]
    if spec.dp_attention:
        args.append("--enable-dp-attention")
    if spec.ep > 1:
        args += ["--ep-size", str(spec.ep)]
    if spec.pp > 1:
        args += ["--pp-size", str(spec.pp)]
    dist_init = dist_init_addr(topology, p)
    if dist_init:
        args += ["--dist-init-addr", dist_init]
        args += ["--nnodes", str(p.nnodes), "--node-rank", str(node.rank)]
    if node.gpus and node.gpus[0] != 0:
        args += ["--base-gpu-id", str(node.gpus[0])]
    return args + render_args(role_args(topology, p.role))


def bind_address(spec: Role, host: Host) -> str:
    """What a role's servers bind on `host` (--host): the role's `bind`, else the host's
    address; bare, as SGLang's uvicorn takes it."""
    return bare_host(spec.bind or host.address)


def dist_init_addr(topology: Topology, p: InstancePlacement) -> str | None:
    """host:port of a multi-node instance's rank 0 (None for a single-node instance)."""
    if p.nnodes == 1 or p.dist_init_port is None:
        return None
    return host_port(topology.host(p.nodes[0].host).address, p.dist_init_port)


def build_workers(
    topology: Topology, placements: list[InstancePlacement], layouts: dict[str, HostLayout]
) -> list[WorkerProcess]:
    module = SIM_MODULE if topology.engine == "sim" else SGLANG_MODULE
    workers = []
    for p in placements:
        spec: Role = getattr(topology, p.role)
        parallelism = Parallelism(
            tp=spec.tp, dp=spec.dp, dp_attention=spec.dp_attention, ep=spec.ep, pp=spec.pp
        )
        for node in p.nodes:
            host = topology.host(node.host)
            nics = choose_nics(topology, host, node.gpus)
            ucx = ucx_net_devices(topology, nics)
            device = None if ucx else ib_device(nics)
            name = process_name(p.name, node.rank, p.nnodes)
            workers.append(
                WorkerProcess(
                    name=name,
                    instance_name=p.name,
                    role=p.role,
                    instance=p.index,
                    node_rank=node.rank,
                    nnodes=p.nnodes,
                    host=host.name,
                    address=bare_host(host.address),
                    bind=bind_address(spec, host),
                    gpus=node.gpus,
                    parallelism=parallelism,
                    http_port=p.http_port,
                    bootstrap_port=p.bootstrap_port,
                    dist_init_addr=dist_init_addr(topology, p),
                    rdma_devices=nics.devices if nics else (),
                    gpu_nics=nics.per_gpu if nics else {},
                    ib_device=device,
                    gid_index=topology.transfer.gid_index,
                    unit=unit_name(topology.name, name),
                    log_path=layouts[host.name].log_file(name),
                    command=Command(
                        module=module, args=tuple(worker_args(topology, p, node, device))
                    ),
                    env=worker_env(topology, p.role, host, ucx),
                )
            )
    return workers


def admission_args(topology: Topology) -> list[str]:
    """pdkit router flags for `router.admission` (none when it is off); the SLO targets default
    to the topology's `slo`."""
    admission = topology.router.admission
    if not admission.enabled:
        return []
    ttft = admission.ttft_ms or topology.slo.ttft_ms
    tpot = admission.tpot_ms or topology.slo.tpot_ms
    return [
        "--admission",
        "--slo-ttft-ms",
        f"{ttft:g}",
        "--slo-tpot-ms",
        f"{tpot:g}",
        "--admission-margin",
        f"{admission.margin:g}",
    ]


def build_router(
    topology: Topology, workers: list[WorkerProcess], layout: HostLayout, topology_dir: Path
) -> RouterProcess:
    router = topology.router
    host = topology.host(topology.router_host)
    policies = {
        role: getattr(router, f"{role}_policy") or DEFAULT_POLICIES[router.kind][role]
        for role in ("prefill", "decode")
    }
    worker_args_: list[str] = []
    for w in workers:
        if not w.serves_http:
            continue
        if w.role == "prefill":
            worker_args_ += ["--prefill", w.url, str(w.bootstrap_port)]
        else:
            worker_args_ += ["--decode", w.url]
    common = ["--host", bare_host(router.bind), "--port", str(router.port)]
    common += ["--prefill-policy", policies["prefill"], "--decode-policy", policies["decode"]]
    extra = render_args({normalize_flag(k): v for k, v in router.args.items()})
    has_key = bool(router.api_key_env or router.api_key_file)
    if router.kind == "pdkit":
        command = Command(
            module=LB_MODULE, args=tuple(worker_args_ + common + admission_args(topology) + extra)
        )
        metrics_port = None
    else:
        metrics = ["--prometheus-host", bare_host(router.bind)]
        metrics += ["--prometheus-port", str(router.metrics_port)]
        command = Command(
            executable=SMG_EXECUTABLE,
            args=tuple(["launch", "--pd-disaggregation", *worker_args_, *common, *metrics, *extra]),
            secret_args=(("--api-key", ROUTER_API_KEY_ENV),) if has_key else (),
        )
        metrics_port = router.metrics_port
    key_file = None
    if router.api_key_file:
        # Relative to the topology's folder, so that every stage reads the same file.
        key_file = str(topology_dir / Path(router.api_key_file).expanduser())
    return RouterProcess(
        name=ROUTER_PROCESS,
        kind=router.kind,
        host=host.name,
        address=bare_host(host.address),
        bind=bare_host(router.bind),
        port=router.port,
        metrics_port=metrics_port,
        prefill_policy=policies["prefill"],
        decode_policy=policies["decode"],
        api_key_env=router.api_key_env,
        api_key_file=key_file,
        unit=unit_name(topology.name, ROUTER_PROCESS),
        log_path=layout.log_file(ROUTER_PROCESS),
        command=command,
        worker_args=tuple(worker_args_),
        env={},
    )


def build_plan(topology: Topology, topology_dir: Path) -> Plan:
    """Render a validated topology into its Plan (call only after validation passed).

    `topology_dir` is the absolute folder of the topology file: relative host roots and key
    files are taken from there."""
    placements, problems = place(topology)
    if problems:  # validation runs first; this guards misuse of the API
        raise ValueError(f"topology does not place: {problems[0]}")
    roots = {h.name: host_root(h.root, topology_dir) for h in topology.hosts}
    layouts = {name: HostLayout(topology.name, root) for name, root in roots.items()}
    workers = build_workers(topology, placements, layouts)
    router = build_router(topology, workers, layouts[topology.router_host], topology_dir)
    model = topology.model
    return Plan(
        name=topology.name,
        engine=topology.engine,
        sglang_version=topology.sglang_version,
        model=ModelPlan(
            path=model.path,
            served_name=model.name,
            revision=model.revision,
            trust_remote_code=model.trust_remote_code,
        ),
        transfer_backend=topology.transfer.backend,
        hosts=tuple(
            HostPlan(
                name=h.name,
                address=bare_host(h.address),
                connection=h.connection,
                ssh_user=h.ssh.user,
                ssh_port=h.ssh.port,
                ssh_key=h.ssh.key,
                gpus=h.gpus,
                gpu_type=h.gpu_type,
                service_manager=h.service_manager,
                root=roots[h.name],
                rdma_devices=h.rdma_devices,
            )
            for h in topology.hosts
        ),
        workers=tuple(workers),
        router=router,
        slo=topology.slo,
        monitoring=build_monitoring(topology, workers, router, layouts),
    )
