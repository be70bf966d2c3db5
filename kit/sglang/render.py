"""An SGLang worker's argv and environment (`python -m sglang.launch_server ARGV`; engine sim
runs `python -m kit.sim` with the same argv). Pure: no I/O, no clock, no randomness; the same
topology always renders byte-identical output. The Plan (`kit.plan`) places the instances and
chooses their RDMA devices, and asks this module for each process's command and env.

Flag rendering: pdkit's own flags first in a fixed order, then the user's `args` sorted by
name (`kit.topology.args`: `_` -> `-`; `true` -> bare flag; `false`/`null` -> nothing; a
list -> flag then items).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from kit.net import bare_host, host_port, is_ip
from kit.sglang import cpu, hicache
from kit.sglang.dialects import dialect
from kit.topology.args import Flag, flag_groups, normalize_flag
from kit.topology.nics import NicChoice
from kit.topology.place import InstancePlacement, Node
from kit.topology.plan_types import Command
from kit.topology.schema import ArgValue, Host, RoleSpec, Topology
from kit.topology.sim_env import SIM_GPU_ENV
from kit.topology.timeouts import timeouts_env, topology_timeouts, user_env

SGLANG_MODULE = "sglang.launch_server"
SIM_MODULE = "kit.sim"

UCX_PORT = 1
"""The HCA port NIXL's UCX uses (SGLang appends port 1 to --disaggregation-ib-device too)."""


def pdkit_default_args(version: str) -> dict[str, ArgValue]:
    """Flags pdkit adds unless the topology sets them: status reads /metrics."""
    return {dialect(version).arg("metrics"): True}


def role_args(topology: Topology, role: str) -> dict[str, ArgValue]:
    """The user's args for a role: pdkit defaults < `cluster:`'s timeouts < the pool's HiCache
    flags (`kv_pool:`, which `args` may not set) < defaults.args < role.args, normalized."""
    spec: RoleSpec = getattr(topology, role)
    merged: dict[str, ArgValue] = {}
    pool = hicache.pool_args(topology, role)
    defaults = pdkit_default_args(topology.sglang_version)
    sources = (defaults, cluster_args(topology), pool, topology.defaults.args, spec.args)
    for source in sources:
        for key, value in source.items():
            merged[normalize_flag(key)] = value
    return merged


def cluster_args(topology: Topology) -> dict[str, ArgValue]:
    """`cluster:`'s flags (its keys, else its profile's): --watchdog-timeout, --dist-timeout."""
    cluster = topology.cluster
    d = dialect(topology.sglang_version)
    args: dict[str, ArgValue] = {}
    if cluster.watchdog is not None:
        args[d.arg("watchdog")] = f"{cluster.watchdog:g}"
    if cluster.distributed_timeout is not None:
        args[d.arg("dist_timeout")] = str(cluster.distributed_timeout)
    return args


def cluster_env(topology: Topology, host_root: str) -> dict[str, str]:
    """`cluster:`'s environment on a host whose absolute root is `host_root`: torch.distributed's
    default timeout and DeepGEMM's kernel cache (a relative folder is under the root)."""
    cluster = topology.cluster
    env: dict[str, str] = {}
    if cluster.distributed_timeout is not None:
        env["TORCH_DISTRIBUTED_DEFAULT_TIMEOUT"] = str(cluster.distributed_timeout)
    if cluster.deep_gemm_dir is not None:
        env["SGLANG_DG_CACHE_DIR"] = str(PurePosixPath(host_root, cluster.deep_gemm_dir))
    return env


PATH_FLAGS = (
    "init-expert-location",
    "deepep-config",
    "expert-distribution-recorder-dir",
    "chat-template",
    "tokenizer-path",
    "speculative-draft-model-path",
    "load-format-config",
)
"""Flags whose value may name a file on the host; an absolute path there must exist on every
host that runs the instance (SGLang opens it at start-up, or fails late)."""


def input_files(topology: Topology, role: str) -> tuple[tuple[str, str], ...]:
    """(--flag, path) of every absolute path a role's path-valued flags name."""
    args = role_args(topology, role)
    return tuple(
        (f"--{flag}", value)
        for flag in PATH_FLAGS
        if isinstance(value := args.get(flag), str) and value.startswith("/")
    )


def host_args(topology: Topology, role: str, host: Host) -> dict[str, ArgValue]:
    """The args of a role's servers on `host`: on a CPU host the CPU profile's defaults
    (`kit.sglang.cpu`) under the topology's (pdkit defaults < CPU profile < defaults.args <
    role.args), else `role_args`."""
    merged = role_args(topology, role)
    if host.device != "cpu":
        return merged
    profile: dict[str, ArgValue] = dict(cpu.args(role))
    return {**pdkit_default_args(topology.sglang_version), **profile, **merged}


def role_env(topology: Topology, role: str) -> dict[str, str]:
    """The user's env for a role: transfer.env < defaults.env < role.env."""
    return user_env(topology, role)


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


def uses_deepep(topology: Topology, role: str) -> bool:
    """Whether the role's MoE all-to-all runs on DeepEP (NVSHMEM over the RDMA NICs)."""
    return role_args(topology, role).get("moe-a2a-backend") == "deepep"


def collective_env(
    topology: Topology, role: str, host: Host, nics: NicChoice | None, nnodes: int
) -> dict[str, str]:
    """NCCL's, NVSHMEM's and gloo's devices for a multi-node or DeepEP process (empty
    otherwise, and for engine sim): the process's own RDMA devices (its GPUs' NICs), the RoCE
    GID index, and the interface that carries the host's address."""
    if topology.engine != "sglang" or (nnodes == 1 and not uses_deepep(topology, role)):
        return {}
    env: dict[str, str] = {}
    devices = nics.devices if nics else ()
    if devices:
        env["NCCL_IB_HCA"] = "=" + ",".join(devices)  # `=`: exact names, not prefixes
        env["NVSHMEM_HCA_LIST"] = ",".join(f"{d}:{UCX_PORT}" for d in devices)
    gid_index = topology.transfer.gid_index
    if gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = env["NVSHMEM_IB_GID_INDEX"] = str(gid_index)
    if host.network_interface:
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = host.network_interface
    return env


def zmq_peers_env(topology: Topology, p: InstancePlacement, host: Host) -> dict[str, str]:
    """A multi-node SGLang instance's ZMQ allow-list: the TCP sockets SGLang binds for its
    nodes (0.5.23 `restrict_zmq_peers`) admit only the instance's own nodes
    (SGLANG_ZMQ_ALLOWED_PEERS, a comma list of IP addresses), and each node connects from its
    own address (SGLANG_ZMQ_SOURCE_IP), so that a host with several addresses is not refused.

    Empty for a single-node instance, engine sim, a version without the allow-list, and where
    a node's address is a name rather than an IP (SGLang takes IP addresses only)."""
    if topology.engine != "sglang" or p.nnodes == 1:
        return {}
    if not dialect(topology.sglang_version).zmq_peer_allow_list:
        return {}
    addresses = [bare_host(topology.host(n.host).address) for n in p.nodes]
    if not all(is_ip(a) for a in addresses):
        return {}
    return {
        "SGLANG_ZMQ_ALLOWED_PEERS": ",".join(dict.fromkeys(addresses)),
        "SGLANG_ZMQ_SOURCE_IP": bare_host(host.address),
    }


def worker_env(
    topology: Topology,
    role: str,
    host: Host,
    ucx_devices: str | None = None,
    collective: dict[str, str] | None = None,
    *,
    pool_clients: int = 1,
) -> dict[str, str]:
    """A worker's environment: pdkit's variables (`collective`: `collective_env`'s; the pool's
    MOONCAKE_*, `pool_clients` being the pool-using processes on the host), then the user's
    `env`, which wins key by key."""
    env: dict[str, str] = dict(collective or {})
    env.update(hicache.pool_env(topology, role, host, pool_clients))
    if topology.engine == "sim" and host.gpu_type:
        env[SIM_GPU_ENV] = host.gpu_type
    # The address the transfer engine advertises to its peers.
    env["SGLANG_HOST_IP"] = bare_host(host.address)
    if host.device == "cpu":
        env.update(cpu.env(bare_host(host.address), topology.transfer.backend))
    gid_index = topology.transfer.gid_index
    if gid_index is not None:
        name = "UCX_IB_GID_INDEX" if topology.transfer.backend == "nixl" else "MC_GID_INDEX"
        env[name] = str(gid_index)
    if ucx_devices:
        env["UCX_NET_DEVICES"] = ucx_devices
    # Both timeouts on both roles: a prefill_complete prefill waits both, and a role switch
    # turns one role into the other.
    env.update(timeouts_env(topology_timeouts(topology)))
    env.update(role_env(topology, role))
    return dict(sorted(env.items()))


def worker_command(
    topology: Topology, p: InstancePlacement, node: Node, device: str | None
) -> Command:
    """What one process of instance `p` runs on `node`; `device` is its
    --disaggregation-ib-device value (`ib_device`)."""
    module = SIM_MODULE if topology.engine == "sim" else SGLANG_MODULE
    return Command(module=module, flags=tuple(worker_flags(topology, p, node, device)))


def worker_flags(
    topology: Topology, p: InstancePlacement, node: Node, device: str | None
) -> list[Flag]:
    """pdkit's flags of one process, each spelled as the pinned version's dialect spells it
    (`Dialect.flag`), then the user's args."""
    spec: RoleSpec = getattr(topology, p.role)
    host = topology.host(node.host)
    model = topology.model
    d = dialect(topology.sglang_version)
    flags: list[Flag] = [(d.flag("model_path"), model.path)]
    if model.served_name:
        flags.append((d.flag("served_model_name"), model.served_name))
    if model.revision:
        flags.append((d.flag("revision"), model.revision))
    if model.trust_remote_code:
        flags.append((d.flag("trust_remote_code"),))
    flags += [(d.flag("host"), bind_address(spec, host)), (d.flag("port"), str(p.http_port))]
    flags.append((d.flag("mode"), p.role))
    if p.bootstrap_port is not None:
        flags.append((d.flag("bootstrap_port"), str(p.bootstrap_port)))
    flags.append((d.flag("transfer_backend"), topology.transfer.backend))
    if device:
        flags.append((d.flag("ib_device"), device))
    flags.append((d.flag("tp"), str(spec.tp)))
    # `--dp-size N --enable-dp-attention` is deprecated (removed after 2026-12-31).
    flags += d.parallel_flags(dp=spec.dp, dp_attention=spec.dp_attention)
    if spec.ep > 1:
        flags.append((d.flag("ep"), str(spec.ep)))
    if spec.pp > 1:
        flags.append((d.flag("pp"), str(spec.pp)))
    dist_init = dist_init_addr(topology, p)
    if dist_init:
        flags.append((d.flag("dist_init_addr"), dist_init))
    if p.nnodes > 1:
        flags += [(d.flag("nnodes"), str(p.nnodes)), (d.flag("node_rank"), str(node.rank))]
    if node.gpus and node.gpus[0] != 0:
        flags.append((d.flag("base_gpu_id"), str(node.gpus[0])))
    if host.device == "cpu":
        flags.append((d.flag("device"), str(cpu.OWNED[cpu.DEVICE_FLAG].value)))
    if p.nccl_port is not None:
        flags.append((d.flag("nccl_port"), str(p.nccl_port)))
    if p.kv_events_port is not None and spec.kv_events is not None:
        config = kv_events_config(p.kv_events_port, spec.kv_events.topic)
        flags.append((d.flag("kv_events_config"), config))
    return flags + flag_groups(host_args(topology, p.role, host))


def kv_events_config(port: int, topic: str) -> str:
    """--kv-events-config: a ZMQ PUB bound on every address at `port` (DP rank r: + r), the
    form SGLang advertises in /server_info for a router to subscribe to."""
    return json.dumps(
        {"endpoint": f"tcp://*:{port}", "publisher": "zmq", "topic": topic},
        separators=(",", ":"),
    )


def bind_address(spec: RoleSpec, host: Host) -> str:
    """What a role's servers bind on `host` (--host): the role's `bind`, else the host's
    address; bare, as SGLang's uvicorn takes it."""
    return bare_host(spec.bind or host.address)


def dist_init_addr(topology: Topology, p: InstancePlacement) -> str | None:
    """host:port of the instance's rank 0 for torch's rendezvous and, with DP attention, the
    ZMQ ports SGLang derives from it (None: a single-node instance without DP attention)."""
    if p.dist_init_port is None:
        return None
    return host_port(topology.host(p.nodes[0].host).address, p.dist_init_port)
