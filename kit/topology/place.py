"""Placement: instances -> hosts, GPUs and ports. Pure and deterministic.

Rules (documented in docs/topology.md):
- Prefill instances are placed first, then decode, each in index order.
- An instance that fits on one host takes GPUs of the first host (in `hosts:` order, or in the
  role's `hosts:` pin order, starting at instance index mod len(pins)) with enough free GPUs:
  a prefill the lowest free ones; a decode the highest on a host prefills may use too (not
  pinned away from it), the lowest otherwise. On a shared host the prefills grow from GPU 0
  up and the decodes from the last GPU down, so adding an instance of one role moves no
  instance of the other (a live change starts the new one and touches nothing else).
- An instance larger than its hosts spans `nnodes = gpus_per_instance / gpus_per_host` whole,
  unused hosts of equal GPU count; every node gets the same ports, rank 0 serves HTTP.
- Per host, instance k of a role gets port base + k (HTTP, bootstrap) and, when it spans hosts
  or runs DP attention, dist-init base + k * DIST_INIT_STRIDE (`kit.topology.listeners` lists
  the ports SGLang derives from it).
- A CPU host (`device: cpu`) has no GPUs: an instance placed there takes none (it is one
  process). A tensor-parallel CPU instance (tp N) spans N CPU hosts that hold no instance yet,
  one rank each (torch.distributed over gloo between them; SGLang's CPU all-reduce within one
  host needs sgl-kernel's shared memory, which pdkit's CPU environment does not have).
- Every instance gets an --nccl-port, base + k per host like HTTP (the same on each of its
  nodes): left to SGLang, it is a random pick in 22000-29999 that may take a port pdkit plans
  (the router's metrics at 29000) or race another server starting on the host. Except data-
  parallel replicas (dp > 1 without dp_attention): SGLang 0.5.23 gives every replica the one
  --nccl-port and binds it once per replica (`launch_dp_schedulers`), so they pick their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.errors import Problem
from kit.topology import ports
from kit.topology.args import normalize_flag
from kit.topology.layout import instance_name
from kit.topology.nics import NicChoice, choose_nics
from kit.topology.schema import ROLE_NAMES, Host, RoleSpec, Topology


@dataclass(frozen=True)
class Node:
    """One process of an instance: its host and GPUs."""

    host: str
    rank: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class InstancePlacement:
    role: str
    index: int
    nodes: tuple[Node, ...]
    http_port: int
    bootstrap_port: int | None
    dist_init_port: int | None
    nccl_port: int | None = None
    """--nccl-port (torch.distributed's port): every instance but DP replicas'."""
    kv_events_port: int | None = None
    """First KV-event publisher port (DP rank r: + r), where the role publishes them."""

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def name(self) -> str:
        return instance_name(self.role, self.index)


@dataclass
class _HostState:
    """A host's free GPUs are always one range, [low, high): prefills take from its bottom,
    decodes from its top."""

    host: Host
    next_port: dict[str, int] = field(default_factory=dict)
    low: int = field(default=0, init=False)
    high: int = field(init=False)
    placed: int = field(default=0, init=False)
    """Instances (or ranks of one) placed on the host."""

    def __post_init__(self) -> None:
        self.high = self.host.gpus

    @property
    def free(self) -> int:
        return self.high - self.low

    @property
    def untouched(self) -> bool:
        return self.low == 0 and self.high == self.host.gpus and not self.placed

    def take(self, need: int, *, top: bool) -> tuple[int, ...]:
        self.placed += 1
        if top:
            self.high -= need
            return tuple(range(self.high, self.high + need))
        self.low += need
        return tuple(range(self.low - need, self.low))


@dataclass(frozen=True)
class Placement:
    """Where the deployment runs, decided once (`placement`) and read by validation and by the
    Plan: every instance's hosts, GPUs and ports, the problems of what does not fit, and the
    RDMA devices of every process (None: KV moves without RDMA)."""

    instances: tuple[InstancePlacement, ...]
    problems: tuple[Problem, ...]
    nics: dict[tuple[str, int], NicChoice | None]
    """(instance name, node rank) -> the devices of that process."""

    def nic(self, instance: InstancePlacement, node: Node) -> NicChoice | None:
        """The RDMA devices of `node` of `instance`."""
        return self.nics[(instance.name, node.rank)]


def placement(topology: Topology) -> Placement:
    """Place every instance (`place`) and choose every process's RDMA devices, once."""
    instances, problems = place(topology)
    nics = {
        (p.name, node.rank): choose_nics(topology, topology.host(node.host), node.gpus)
        for p in instances
        for node in p.nodes
    }
    return Placement(tuple(instances), tuple(problems), nics)


def role_switchable(topology: Topology, role: str) -> bool:
    """The role's instances start with --enable-pd-role-switch (defaults.args or its args)."""
    spec: RoleSpec = getattr(topology, role)
    merged = {
        normalize_flag(k): v
        for source in (topology.defaults.args, spec.args)
        for k, v in source.items()
    }
    return merged.get("enable-pd-role-switch") is True


def role_ports(topology: Topology, role: str) -> tuple[int, int, int]:
    """(HTTP base, bootstrap base, dist-init base) for a role, defaults applied."""
    spec: RoleSpec = getattr(topology, role)
    http = spec.port or (ports.PREFILL_HTTP if role == "prefill" else ports.DECODE_HTTP)
    bootstrap = spec.bootstrap_port or ports.BOOTSTRAP
    dist_init = spec.dist_init_port or (
        ports.PREFILL_DIST_INIT if role == "prefill" else ports.DECODE_DIST_INIT
    )
    return http, bootstrap, dist_init


def nccl_base(topology: Topology, role: str) -> int:
    """The first --nccl-port of a role on each host, default applied."""
    spec: RoleSpec = getattr(topology, role)
    return spec.nccl_port or (ports.PREFILL_NCCL if role == "prefill" else ports.DECODE_NCCL)


def place(topology: Topology) -> tuple[list[InstancePlacement], list[Problem]]:
    """Assign every instance to hosts, GPUs and ports; problems say what does not fit."""
    states = {h.name: _HostState(h) for h in topology.hosts}
    placements: list[InstancePlacement] = []
    problems: list[Problem] = []
    prefill_pins = [name for name in topology.prefill.hosts if name in states]
    shared = set(prefill_pins or states)
    for role in ROLE_NAMES:
        spec: RoleSpec = getattr(topology, role)
        pins = [name for name in spec.hosts if name in states]
        candidates = pins or [h.name for h in topology.hosts]
        if not candidates:
            continue  # unknown pins are reported by validate
        for index in range(spec.count):
            start = index % len(candidates) if pins else 0
            order = candidates[start:] + candidates[:start]
            top = shared if role == "decode" else set()
            nodes = _fit(spec.gpus_per_instance, [states[n] for n in order], top, spec.tp)
            if nodes is None:
                problems.append(_no_fit(topology, role, index, spec, [states[n] for n in order]))
                continue
            placements.append(_assign_ports(topology, role, index, nodes, states))
    return placements, problems


def _fit(need: int, hosts: list[_HostState], top: set[str], tp: int) -> tuple[Node, ...] | None:
    """The nodes for one instance; on a host in `top` it takes the highest free GPUs. On CPU
    hosts, a tp > 1 instance takes `tp` hosts of its own, one rank each."""
    cpu = [s for s in hosts if s.host.device == "cpu"]
    if cpu and tp > 1:
        empty = [s for s in cpu if s.untouched]
        if len(empty) < tp:
            return None
        return tuple(
            Node(s.host.name, rank, s.take(0, top=False)) for rank, s in enumerate(empty[:tp])
        )
    for state in hosts:
        on_host = 0 if state.host.device == "cpu" else need  # a CPU instance takes no GPU
        if state.free >= on_host:
            gpus = state.take(on_host, top=state.host.name in top)
            return (Node(state.host.name, 0, gpus),)
    # Larger than any single host: span whole, untouched hosts of one GPU count.
    sizes = {s.host.gpus for s in hosts if s.host.gpus > 0}
    for size in sorted(sizes, reverse=True):
        if need <= size or need % size:
            continue
        empty = [s for s in hosts if s.host.gpus == size and s.untouched]
        nnodes = need // size
        if len(empty) >= nnodes:
            return tuple(
                Node(s.host.name, rank, s.take(size, top=s.host.name in top))
                for rank, s in enumerate(empty[:nnodes])
            )
    return None


def _no_fit(
    topology: Topology, role: str, index: int, spec: RoleSpec, hosts: list[_HostState]
) -> Problem:
    need = spec.gpus_per_instance
    if any(s.host.device == "cpu" for s in hosts):
        empty = [s.host.name for s in hosts if s.host.device == "cpu" and s.untouched]
        why = (
            f"{role} instance {index} on CPU hosts runs one rank per host (tp {spec.tp}), so it "
            f"needs {spec.tp} CPU hosts that hold no instance yet; such hosts left: "
            f"{', '.join(empty) or 'none'}."
        )
        fix = f"add CPU hosts, lower {role}.count, or set {role}.tp: 1 and scale with {role}.count."
        return Problem((role,), why, fix)
    free = ", ".join(f"{s.host.name}: {s.free} of {s.host.gpus}" for s in hosts)
    biggest = max((s.host.gpus for s in hosts), default=0)
    if biggest and need > biggest and need % biggest:
        why = (
            f"{role} instance {index} needs {need} GPUs (tp {spec.tp} x pp {spec.pp}"
            f"{'' if spec.dp_attention else f' x dp {spec.dp}'}), more than one host has, and "
            f"{need} is not a multiple of the {biggest} GPUs per host, so it cannot span hosts."
        )
    else:
        why = (
            f"{role} instance {index} needs {need} GPUs "
            f"(tp {spec.tp} x pp {spec.pp}{'' if spec.dp_attention else f' x dp {spec.dp}'}); "
            f"free GPUs per host after earlier instances: {free}."
        )
    fix = f"add hosts or GPUs, lower {role}.count, or lower {role}.tp/pp/dp."
    return Problem((role,), why, fix)


def _assign_ports(
    topology: Topology,
    role: str,
    index: int,
    nodes: tuple[Node, ...],
    states: dict[str, _HostState],
) -> InstancePlacement:
    http_base, bootstrap_base, dist_base = role_ports(topology, role)

    def take(kind: str, base: int, step: int = 1) -> int:
        # Every node of a multi-node instance gets the same port: the highest next one.
        port = max(states[n.host].next_port.get(kind, base) for n in nodes)
        for node in nodes:
            states[node.host].next_port[kind] = port + step
        return port

    http_port = take(f"{role}-http", http_base)
    # A decode that may switch to prefill at run time (SGLang's --enable-pd-role-switch) starts
    # a bootstrap server on its own port when it does: it needs one as a prefill does.
    switchable = role_switchable(topology, role)
    bootstrap = take("bootstrap", bootstrap_base) if role == "prefill" or switchable else None
    # A DP-attention instance gets a dist-init port on one host too: SGLang would otherwise
    # derive its ZMQ ports from --port (+ 233 ..), and instances at ports k and k + 1 collide.
    spec: RoleSpec = getattr(topology, role)
    needs_dist_init = len(nodes) > 1 or spec.parallelism.attention_dp
    dist_init = take(f"{role}-dist", dist_base, ports.DIST_INIT_STRIDE) if needs_dist_init else None
    replicas = spec.dp > 1 and not spec.parallelism.attention_dp  # each binds its own
    nccl = None if replicas else take(f"{role}-nccl", nccl_base(topology, role))
    kv = None
    if spec.kv_events is not None:
        kv_base = spec.kv_events.port or (
            ports.PREFILL_KV_EVENTS if role == "prefill" else ports.DECODE_KV_EVENTS
        )
        kv = take(f"{role}-kv-events", kv_base, spec.dp)
    return InstancePlacement(role, index, nodes, http_port, bootstrap, dist_init, nccl, kv)
