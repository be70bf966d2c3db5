"""What a CPU host (`hosts[].device: cpu`) cannot do, each said with the key and the fix.

A CPU host runs SGLang's CPU engine (kit/sglang/cpu.py): no GPUs, so no GPU model, no RDMA
devices and no NIC map; one process per instance on a host (data, expert and pipeline
parallelism on CPU, and tensor parallelism within one host, need sgl-kernel's shared-memory
all-reduce and thread binding, `srt/distributed/parallel_state.py:697` and
`srt/distributed/bootstrap.py:277`, which the CPU environment pdkit measured does not have); a
tp N instance spans N CPU hosts, one rank each, over gloo (measured: its greedy tokens equal a
one-process instance's), which needs each host's `network_interface` (GLOO_SOCKET_IFNAME: gloo
binds 127.0.0.1 otherwise and the ranks never connect) and the role's
SGLANG_CPU_OMP_THREADS_BIND (SGLang asserts tp ranks <= NUMA nodes without it,
`srt/utils/numa_utils.py:461`); KV over Mooncake's TCP transport only (RDMA needs a
NIC the host does not list, and NIXL on CPU was never measured). Prefill and decode on a CPU
and a GPU host at once were never measured either: pdkit refuses the mix.
"""

from __future__ import annotations

from collections.abc import Iterator

from kit.errors import Problem
from kit.topology.place import Placement
from kit.topology.schema import RoleSpec, Topology
from kit.topology.timeouts import user_env


def cpu_host_problems(topology: Topology, placed: Placement) -> Iterator[Problem]:
    """Every problem of the topology's CPU hosts and the instances placed on them."""
    cpu = {h.name for h in topology.hosts if h.device == "cpu"}
    if not cpu:
        return
    for i, host in enumerate(topology.hosts):
        if host.device != "cpu":
            continue
        fix_gpu = "or set device: cuda if the host has GPUs."
        if host.gpus:
            yield Problem(
                ("hosts", i, "gpus"),
                f"{host.name} is a CPU host (device: cpu) and has no GPUs.",
                f"set gpus: 0, {fix_gpu}",
            )
        if host.gpu_type:
            yield Problem(
                ("hosts", i, "gpu_type"),
                f"{host.name} is a CPU host (device: cpu) and has no GPU model.",
                f"remove gpu_type, {fix_gpu}",
            )
        tcp = "KV moves over TCP there (transfer.backend: mooncake_tcp)"
        if host.rdma_devices:
            yield Problem(
                ("hosts", i, "rdma_devices"),
                f"{host.name} is a CPU host (device: cpu): pdkit uses no RDMA device there.",
                f"remove rdma_devices; {tcp}.",
            )
        if host.gpu_nics:
            yield Problem(
                ("hosts", i, "gpu_nics"),
                f"{host.name} is a CPU host (device: cpu): it has no GPUs to map to NICs.",
                f"remove gpu_nics; {tcp}.",
            )
    yield from _instances(topology, placed, cpu)


def _instances(topology: Topology, placed: Placement, cpu: set[str]) -> Iterator[Problem]:
    on_cpu: dict[str, str] = {}  # role -> a CPU host it runs on
    on_gpu: dict[str, str] = {}
    for p in placed.instances:
        for node in p.nodes:
            (on_cpu if node.host in cpu else on_gpu).setdefault(p.role, node.host)
    for role, host in on_cpu.items():
        spec: RoleSpec = getattr(topology, role)
        if spec.tp > 1:
            yield from _multi_node(topology, role, spec)
        for key in ("dp", "ep", "pp"):
            size = getattr(spec, key)
            if size > 1:
                yield Problem(
                    (role, key),
                    f"{role} runs on CPU host {host}, where an instance is one process per "
                    f"host; {key} {size} needs sgl-kernel's CPU all-reduce, which pdkit's CPU "
                    "environment does not have.",
                    f"set {role}.{key}: 1, and scale with {role}.count instead.",
                )
        if spec.dp_attention:
            yield Problem(
                (role, "dp_attention"),
                f"{role} runs on CPU host {host}, where an instance is one process.",
                f"set {role}.dp_attention: false.",
            )
    if on_cpu and on_gpu:
        cpu_host, gpu_host = next(iter(on_cpu.values())), next(iter(on_gpu.values()))
        index = [h.name for h in topology.hosts].index(cpu_host)
        yield Problem(
            ("hosts", index, "device"),
            f"workers run on CPU host {cpu_host} and on GPU host {gpu_host}: KV between a CPU "
            "and a GPU server was never measured, and pdkit does not deploy the mix.",
            "put every worker on hosts of one device (pin the roles with prefill.hosts / "
            "decode.hosts).",
        )
    if not on_cpu:
        return
    host = next(iter(on_cpu.values()))
    backend = topology.transfer.backend
    if backend != "mooncake_tcp":
        how = "over RDMA" if backend == "mooncake" else "through NIXL (never measured on CPU)"
        yield Problem(
            ("transfer", "backend"),
            f"transfer.backend {backend} moves KV {how}, and workers run on CPU host {host}, "
            "which has no RDMA device.",
            "set transfer.backend: mooncake_tcp.",
        )
    if topology.transfer.ib_devices is not None:
        yield Problem(
            ("transfer", "ib_devices"),
            f"workers run on CPU host {host}, which has no RDMA device.",
            "remove transfer.ib_devices (mooncake_tcp uses none).",
        )


def _multi_node(topology: Topology, role: str, spec: RoleSpec) -> Iterator[Problem]:
    """What a tp > 1 instance on CPU hosts (one rank per host, over gloo) needs beyond any
    multi-node instance's `network_interface` (validate says so for every engine)."""
    if "SGLANG_CPU_OMP_THREADS_BIND" not in user_env(topology, role):
        yield Problem(
            (role, "env"),
            f"{role} spans CPU hosts (tp {spec.tp}, one rank per host): SGLang binds each rank's "
            "threads to a NUMA node unless told which cores, and asserts tp ranks <= NUMA nodes.",
            f"set {role}.env.SGLANG_CPU_OMP_THREADS_BIND to the cores one rank uses on its "
            "host, e.g. '0-15'.",
        )
