"""Checks of meaning that need no SGLang knowledge: references between keys, GPUs, ports,
addresses and RDMA devices. Each check returns problems; `validate` runs them all.

SGLang-specific checks (flags, values, backend compatibility) live in `kit.sglang.check`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from kit.errors import Problem
from kit.net import bare_host, is_ip, is_loopback
from kit.topology import ports
from kit.topology.autoscale_checks import autoscale_problems
from kit.topology.cpu_hosts import cpu_host_problems
from kit.topology.kvpool import kv_pool_host, kv_pool_problems
from kit.topology.listeners import process_ports
from kit.topology.place import InstancePlacement, Placement, placement
from kit.topology.policies import PDKIT_POLICIES, SMG_POLICIES
from kit.topology.schema import ROLE_NAMES, RoleSpec, Topology
from kit.topology.timeouts import env_problems as timeout_env_problems


def validate(topology: Topology, placed: Placement | None = None) -> list[Problem]:
    """Every problem in the topology (empty when it can be deployed); `placed` is its
    placement when the caller has it already (else it is placed here)."""
    problems = [*_references(topology), *_nics(topology), *_router(topology)]
    problems += _monitoring(topology)
    problems += kv_pool_problems(topology)
    problems += autoscale_problems(topology)
    problems += timeout_env_problems(topology)
    placed = placed or placement(topology)
    problems += placed.problems
    problems += cpu_host_problems(topology, placed)
    if not placed.problems:
        placements = list(placed.instances)
        problems += _port_collisions(topology, placements)
        problems += _addresses(topology, placements)
        problems += _rdma_coverage(topology, placed)
        problems += _interfaces(topology, placements)
    return problems


def _interfaces(topology: Topology, placements: list[InstancePlacement]) -> Iterator[Problem]:
    """A host of a multi-node SGLang instance names the interface NCCL and gloo use."""
    if topology.engine != "sglang":
        return
    seen: set[str] = set()
    for p in placements:
        if p.nnodes == 1:
            continue
        for node in p.nodes:
            host = topology.host(node.host)
            if host.network_interface or node.host in seen:
                continue
            seen.add(node.host)
            yield Problem(
                ("hosts", _host_index(topology, node.host), "network_interface"),
                f"{p.name} spans hosts, and {node.host} does not say which interface carries "
                f"{host.address}: gloo may bind the 127.0.1.1 the host name maps to, and the "
                "ranks never meet.",
                f"set it to the interface `ip -o addr show to {host.address}` names (it is "
                "rendered as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME), or run `pdkit "
                "discover T`, whose facts fill it in.",
            )


def _references(topology: Topology) -> Iterator[Problem]:
    names = [h.name for h in topology.hosts]
    for name, count in Counter(names).items():
        if count > 1:
            index = names.index(name, names.index(name) + 1)
            yield Problem(
                ("hosts", index, "name"),
                f"host name '{name}' is used twice.",
                "give every host a unique name.",
            )
    for role in ROLE_NAMES:
        spec: RoleSpec = getattr(topology, role)
        for i, pin in enumerate(spec.hosts):
            if pin not in names:
                yield Problem(
                    (role, "hosts", i),
                    f"no host named '{pin}'.",
                    f"use one of: {', '.join(names)}.",
                )
    if topology.decode.bootstrap_port is not None:
        yield Problem(
            ("decode", "bootstrap_port"),
            "decode instances run no bootstrap server.",
            "remove decode.bootstrap_port; set prefill.bootstrap_port instead.",
        )


def _nics(topology: Topology) -> Iterator[Problem]:
    for i, host in enumerate(topology.hosts):
        for gpu, device in host.gpu_nics.items():
            if not 0 <= gpu < host.gpus:
                yield Problem(
                    ("hosts", i, "gpu_nics", gpu),
                    f"GPU {gpu} does not exist on {host.name} ({host.gpus} GPUs).",
                    f"use GPU indices 0..{host.gpus - 1}.",
                )
            elif host.rdma_devices and device not in host.rdma_devices:
                yield Problem(
                    ("hosts", i, "gpu_nics", gpu),
                    f"'{device}' is not in {host.name}'s rdma_devices.",
                    f"add it to rdma_devices or use one of {', '.join(host.rdma_devices)}.",
                )


def _router(topology: Topology) -> Iterator[Problem]:
    router = topology.router
    names = [h.name for h in topology.hosts]
    if router.host is not None and router.host not in names:
        yield Problem(
            ("router", "host"),
            f"no host named '{router.host}'.",
            f"use one of: {', '.join(names)}.",
        )
    for i, name in enumerate(router.hosts or ()):
        if name not in names:
            yield Problem(
                ("router", "hosts", str(i)),
                f"no host named '{name}'.",
                f"use one of: {', '.join(names)}.",
            )
    for i, name in enumerate(router.hosts or () if router.vip else ()):
        if name in names and not is_ip(bare_host(topology.host(name).address)):
            yield Problem(
                ("router", "hosts", str(i)),
                f"host '{name}' has the address {topology.host(name).address!r}: keepalived "
                "sends its VRRP adverts between IP addresses.",
                f"give host '{name}' its IP address.",
            )
    if router.vip is not None and bare_host(router.bind) not in ("0.0.0.0", "::"):
        yield Problem(
            ("router", "bind"),
            f"the router binds {router.bind} only, so it cannot answer on the VIP "
            f"{router.vip.address}.",
            "bind 0.0.0.0 (the default) or ::.",
        )
    for role in ROLE_NAMES:
        policy = getattr(router, f"{role}_policy")
        allowed = PDKIT_POLICIES[role] if router.kind == "pdkit" else SMG_POLICIES
        if policy is not None and policy not in allowed:
            yield Problem(
                ("router", f"{role}_policy"),
                f"'{policy}' is not a {role} policy of the {router.kind} router.",
                f"use one of: {', '.join(allowed)}.",
            )
    if router.kind == "pdkit" and router.metrics_port != ports.ROUTER_METRICS:
        yield Problem(
            ("router", "metrics_port"),
            "the pdkit router serves /metrics on its main port.",
            "remove router.metrics_port (it applies to kind smg only).",
        )


def _monitoring(topology: Topology) -> list[Problem]:
    monitoring = topology.monitoring
    names = [h.name for h in topology.hosts]
    if monitoring is not None and topology.router.tls is not None:
        return [
            Problem(
                ("router", "tls"),
                "Prometheus (monitoring:) scrapes the router over plain HTTP; pdkit does not "
                "render an https scrape yet.",
                "leave out router.tls or monitoring:, or scrape the router yourself.",
            )
        ]
    if monitoring is None or monitoring.host is None or monitoring.host in names:
        return []
    return [
        Problem(
            ("monitoring", "host"),
            f"no host named '{monitoring.host}'.",
            f"use one of: {', '.join(names)}.",
        )
    ]


def _monitoring_host(topology: Topology) -> str | None:
    """The host Prometheus runs on, None when monitoring is off or its host is unknown."""
    if topology.monitoring is None:
        return None
    host = topology.monitoring.host or topology.router_host
    return host if host in {h.name for h in topology.hosts} else None


def _port_collisions(topology: Topology, placements: list[InstancePlacement]) -> list[Problem]:
    """No two listeners share a port on one address (hosts may share an address)."""
    taken: dict[tuple[str, int], str] = {}
    problems: list[Problem] = []

    def claim(host_name: str, port: int, what: str, path: tuple[str | int, ...]) -> None:
        address = topology.host(host_name).address
        owner = taken.get((address, port))
        if owner is not None:
            problems.append(
                Problem(
                    path,
                    f"port {port} on {host_name} is used by both {owner} and {what}.",
                    "change one of the port bases so that the "
                    "ranges (base + instance index) do not overlap.",
                )
            )
        else:
            taken[(address, port)] = what
        if (
            topology.transfer.backend != "nixl"
            and port in ports.MOONCAKE_RPC
            and not what.startswith("the router")
        ):
            problems.append(
                Problem(
                    path,
                    f"port {port} ({what}) lies in the Mooncake transfer "
                    f"engine's RPC range {ports.MOONCAKE_RPC.start}-"
                    f"{ports.MOONCAKE_RPC.stop - 1}, where it may be taken at "
                    "random.",
                    "choose a port outside that range.",
                )
            )

    keys = {"HTTP": "port", "bootstrap": "bootstrap_port", "NCCL": "nccl_port"}
    for p in placements:
        for node in p.nodes:
            for use in process_ports(topology, p, node):
                if use.what == "Mooncake RPC":
                    continue  # a range the engine picks from at random, checked above
                key = keys.get(use.what, "dist_init_port")
                for port in use.ports:
                    claim(node.host, port, f"{p.name} ({use.what})", (p.role, key))
    router = topology.router
    if topology.router_host not in {h.name for h in topology.hosts}:
        return problems  # the unknown router host is reported by _router
    claim(topology.router_host, router.port, "the router", ("router", "port"))
    known = {h.name for h in topology.hosts}
    for replica in (router.hosts or [])[1:]:
        if replica in known:
            claim(replica, router.port, "a router replica", ("router", "port"))
    if router.kind == "smg":
        claim(
            topology.router_host,
            router.metrics_port,
            "the router's metrics",
            ("router", "metrics_port"),
        )
    monitoring_host = _monitoring_host(topology)
    if topology.monitoring is not None and monitoring_host is not None:
        claim(monitoring_host, topology.monitoring.port, "Prometheus", ("monitoring", "port"))
    pool, pool_host = topology.kv_pool, kv_pool_host(topology)
    if pool is not None and pool_host is not None:
        claim(pool_host, pool.rpc_port, "the KV pool master", ("kv_pool", "rpc_port"))
        claim(pool_host, pool.metrics_port, "the KV pool metrics", ("kv_pool", "metrics_port"))
        if pool.metadata_server == "embedded":
            claim(
                pool_host,
                pool.metadata_port,
                "the KV pool metadata server",
                ("kv_pool", "metadata_port"),
            )
    return problems


def _addresses(topology: Topology, placements: list[InstancePlacement]) -> Iterator[Problem]:
    """Whoever must reach a process on another host needs a routable address to reach."""
    decode_hosts = {n.host for p in placements if p.role == "decode" for n in p.nodes}
    router_host = topology.router_host
    if router_host not in {h.name for h in topology.hosts}:
        router_host = ""  # reported by _router
    monitoring_host = _monitoring_host(topology)
    reported: set[tuple[str, str]] = set()
    for p in placements:
        spec: RoleSpec = getattr(topology, p.role)
        for node in p.nodes:
            host = topology.host(node.host)
            bind = spec.bind or host.address
            peers = set()
            if p.role == "prefill":
                peers |= decode_hosts - {node.host}
            if router_host and router_host != node.host and node.rank == 0:
                peers.add(router_host)
            if monitoring_host and monitoring_host != node.host and node.rank == 0:
                peers.add(monitoring_host)
            if p.nnodes > 1:
                peers |= {n.host for n in p.nodes} - {node.host}
            if not peers:
                continue
            for what, value, path in (
                ("binds", bind, (p.role, "bind")),
                (
                    "is reached at",
                    host.address,
                    ("hosts", _host_index(topology, node.host), "address"),
                ),
            ):
                if is_loopback(value) and (p.role, what) not in reported:
                    reported.add((p.role, what))
                    yield Problem(
                        path,
                        f"{p.name} on {node.host} {what} {value}, which "
                        f"{', '.join(sorted(peers))} cannot reach.",
                        f"use {node.host}'s routable address (or 0.0.0.0 for bind).",
                    )


def _rdma_coverage(topology: Topology, placed: Placement) -> Iterator[Problem]:
    """With RDMA (backend mooncake or nixl) every process has devices, and only devices its
    host has.

    Listed devices (`transfer.ib_devices: [...]`) are checked against every worker host's
    `rdma_devices` when the host lists any, on the sim engine too (the topology is meant for real
    hosts); the rest is checked for engine sglang only, where a missing device fails transfers."""
    seen: set[str] = set()
    for p in placed.instances:
        for node in p.nodes:
            if node.host in seen:
                continue
            host = topology.host(node.host)
            choice = placed.nic(p, node)
            if choice is None:
                return
            if host.device == "cpu":
                continue  # kit.topology.cpu_hosts says what a CPU host cannot do
            index = _host_index(topology, node.host)
            problem: Problem | None = None
            if choice.mode == "list":
                unknown = [d for d in choice.devices if d not in host.rdma_devices]
                if host.rdma_devices and unknown:
                    problem = Problem(
                        ("transfer", "ib_devices"),
                        f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not in "
                        f"{node.host}'s rdma_devices ({', '.join(host.rdma_devices)}), and "
                        f"{p.name} runs there.",
                        f"list only devices every worker host has, or add them to hosts[{index}]"
                        ".rdma_devices.",
                    )
            elif topology.engine == "sim":  # emulated GPUs need no device
                problem = None
            elif choice.mode == "per_gpu" and choice.unmapped_gpus:
                problem = Problem(
                    ("hosts", index, "gpu_nics"),
                    f"{p.name} uses GPUs {list(choice.unmapped_gpus)} on {node.host}, which have "
                    "no RDMA device in gpu_nics.",
                    "map every GPU to a NIC, or set "
                    "transfer.backend: mooncake_tcp to move KV over TCP.",
                )
            elif choice.mode == "host" and not choice.devices:
                problem = Problem(
                    ("hosts", index, "rdma_devices"),
                    f"{node.host} runs {p.name} but lists no RDMA device, and "
                    f"transfer.backend {topology.transfer.backend} moves KV over RDMA.",
                    "list the host's rdma_devices (see `ibv_devices`), or set "
                    "transfer.backend: mooncake_tcp.",
                )
            if problem is not None:
                seen.add(node.host)
                yield problem


def _host_index(topology: Topology, name: str) -> int:
    return [h.name for h in topology.hosts].index(name)
