"""A validated topology and its placement -> the Plan. Pure: no I/O, no clock, no randomness;
the same topology always gives a byte-identical Plan.

The placement (hosts, GPUs, ports, RDMA devices) is decided once, before validation, and
handed in; each worker's argv and env come from `kit.sglang.render`, its launch record from
`kit.plan.launch`, the router from `kit.plan.router`, Prometheus from `kit.plan.monitoring`,
the KV pool's master from `kit.plan.kvpool`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from kit.net import bare_host, host_port
from kit.plan.kvpool import build_kv_pool
from kit.plan.launch import worker_launch
from kit.plan.monitoring import build_monitoring
from kit.plan.router import build_router
from kit.plan.vip import build_router_vip
from kit.sglang import hicache, render
from kit.sglang.dialects import dialect
from kit.topology import ports
from kit.topology.layout import HostLayout, host_root, process_name, unit_name
from kit.topology.listeners import process_ports
from kit.topology.place import InstancePlacement, Placement
from kit.topology.plan_types import HostPlan, ModelPlan, Plan, WorkerProcess
from kit.topology.schema import RoleSpec, Topology
from kit.topology.slurm_schema import Slurm


def local_path(path: str, topology_dir: Path) -> str:
    """`path` made absolute when it starts with ./ or ../ (taken from the topology file's
    folder, `topology_dir`), else as it is (an absolute path, or a Hugging Face repo id)."""
    if path.startswith(("./", "../")):
        return host_root(path, topology_dir)
    return path


def _paths_resolved(topology: Topology, topology_dir: Path) -> Topology:
    """The topology with a ./ or ../ model path taken from the topology file's folder, so that
    every worker (whatever its working folder) and kit/perf find the same model."""
    model = topology.model
    resolved = local_path(model.path, topology_dir)
    if resolved == model.path:
        return topology
    return topology.model_copy(update={"model": model.model_copy(update={"path": resolved})})


def sglang_python(topology: Topology, host_name: str, topology_dir: Path) -> str | None:
    """The interpreter of engine sglang's workers on a host (absolute), None: pdkit's own."""
    python = topology.host(host_name).sglang_python
    if topology.engine != "sglang" or python is None:
        return None
    return host_root(python, topology_dir)


def rank_group_addr(topology: Topology, p: InstancePlacement) -> str | None:
    """host:port of the rank group's leader (kit/ranks, beside node rank 0) of a multi-node
    instance; None for an instance of one node, and under Slurm (an instance is one job step,
    which Slurm ends and the job starts again as a whole)."""
    if p.nnodes == 1 or p.dist_init_port is None or topology.launcher == "slurm":
        return None
    return host_port(
        topology.host(p.nodes[0].host).address, ports.rank_group_port(p.dist_init_port)
    )


def build_workers(
    topology: Topology,
    placed: Placement,
    layouts: dict[str, HostLayout],
    topology_dir: Path = Path("/"),
) -> list[WorkerProcess]:
    """Every worker process, instance by instance in placement order, node by node."""
    workers = []
    pool_clients = Counter(
        node.host
        for p in placed.instances
        if hicache.uses_pool(topology, p.role)
        for node in p.nodes
    )
    for p in placed.instances:
        spec: RoleSpec = getattr(topology, p.role)
        launch = worker_launch(topology, p)
        for node in p.nodes:
            host = topology.host(node.host)
            nics = placed.nic(p, node)
            ucx = render.ucx_net_devices(topology, nics)
            device = None if ucx else render.ib_device(nics)
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
                    bind=render.bind_address(spec, host),
                    gpus=node.gpus,
                    launch=launch,
                    http_port=p.http_port,
                    bootstrap_port=p.bootstrap_port,
                    ports=process_ports(topology, p, node),
                    dist_init_addr=render.dist_init_addr(topology, p),
                    rank_group_addr=rank_group_addr(topology, p),
                    nccl_port=p.nccl_port,
                    rdma_devices=nics.devices if nics else (),
                    gpu_nics=nics.per_gpu if nics else {},
                    ib_device=device,
                    gid_index=topology.transfer.gid_index,
                    unit=unit_name(topology.name, name),
                    log_path=layouts[host.name].log_file(name),
                    command=render.worker_command(topology, p, node, device),
                    input_files=render.input_files(topology, p.role),
                    env=render.worker_env(
                        topology,
                        p.role,
                        host,
                        ucx,
                        render.collective_env(topology, p.role, host, nics, p.nnodes)
                        | render.zmq_peers_env(topology, p, host)
                        | render.cluster_env(topology, layouts[host.name].root),
                        pool_clients=pool_clients[host.name],
                    ),
                    python=sglang_python(topology, host.name, topology_dir),
                )
            )
    return workers


def build_plan(
    topology: Topology, topology_dir: Path, placed: Placement, discovered: Sequence[str] = ()
) -> Plan:
    """The Plan of a validated topology placed as `placed` (call only after validation passed).

    `topology_dir` is the absolute folder of the topology file: relative host roots and key
    files are taken from there. `discovered`: the fields `pdkit discover`'s facts filled in
    (`kit.topology.facts.with_facts`), recorded in the Plan."""
    if placed.problems:  # validation runs first; this guards misuse of the API
        raise ValueError(f"topology does not place: {placed.problems[0]}")
    topology = _paths_resolved(topology, topology_dir)
    roots = {h.name: host_root(h.root, topology_dir) for h in topology.hosts}
    layouts = {name: HostLayout(topology.name, root) for name, root in roots.items()}
    workers = build_workers(topology, placed, layouts, topology_dir)
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
                device=h.device,
                gpus=h.gpus,
                gpu_type=h.gpu_type,
                service_manager=h.service_manager,
                root=roots[h.name],
                rdma_devices=h.rdma_devices,
                sglang_python=sglang_python(topology, h.name, topology_dir),
            )
            for h in topology.hosts
        ),
        workers=tuple(workers),
        router=router,
        slo=topology.slo,
        readiness_timeout_s=topology.cluster.readiness_timeout,
        monitoring=build_monitoring(topology, workers, router, layouts),
        kv_pool=build_kv_pool(topology, workers, layouts),
        router_hosts=tuple(topology.router.hosts or ()),
        router_vip=build_router_vip(topology, layouts),
        packages=dialect(topology.sglang_version).packages,
        discovered=tuple(discovered),
        slurm=_slurm_paths(topology.slurm, topology_dir),
    )


def _slurm_paths(slurm: Slurm | None, topology_dir: Path) -> Slurm | None:
    """`slurm:` with its root and venv absolute (taken from the topology's folder)."""
    if slurm is None:
        return None
    venv = host_root(slurm.venv, topology_dir) if slurm.venv else None
    return slurm.model_copy(update={"root": host_root(slurm.root, topology_dir), "venv": venv})
