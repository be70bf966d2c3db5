"""What `pdkit discover` found on the hosts, kept for the topology's later commands, and the
topology fields that follow from it where the topology leaves them out.

1. `pdkit discover T` saves, per host, the interface that carries the host's address, the
   RDMA devices (link layer, ACTIVE or not, GID table) and its proposed GPU -> NIC map, in
   ``discovered.json`` in the deployment's state dir (`facts_file`).
2. Every command resolves the topology with them (`kit.plan.resolve`): `with_facts` fills a
   host's `network_interface`, `rdma_devices` and `gpu_nics` and `transfer.gid_index` where
   the topology does not set them (an explicit key always wins), and says what it took.
3. The GID index taken is the lowest RoCE v2 index whose GID is an IPv4-mapped address
   (``::ffff:a.b.c.d``, the one Mooncake's, NCCL's and NVSHMEM's RoCE v2 traffic routes on) on
   every RoCE NIC the workers use; else the lowest routable (not link-local) RoCE v2 index
   they all have. Facts of a host whose address changed since are ignored.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field, ValidationError

from kit.errors import Problem, TopologyError
from kit.topology.layout import state_dir
from kit.topology.nics import RDMA_BACKENDS, choose_nics
from kit.topology.schema import Host, Topology
from kit.topology.strict import Strict

FACTS_FILE = "discovered.json"
"""`pdkit discover`'s facts, in the deployment's state dir."""


class GidFact(Strict):
    """One entry of a port's GID table (sysfs `gids/N`, `gid_attrs/types/N`)."""

    index: int
    gid: str
    kind: str = Field(description='"RoCE v2", "IB/RoCE v1", ...')

    def _address(self) -> ipaddress.IPv6Address | None:
        try:
            return ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None

    @property
    def routable_v2(self) -> bool:
        """A RoCE v2 GID that leaves the subnet: not link-local (fe80::/10)."""
        address = self._address()
        return "v2" in self.kind.lower() and address is not None and not address.is_link_local

    @property
    def ipv4_v2(self) -> bool:
        """A RoCE v2 GID holding an IPv4 address (``::ffff:a.b.c.d``)."""
        address = self._address()
        return self.routable_v2 and address is not None and address.ipv4_mapped is not None


class NicFact(Strict):
    """One RDMA device of a host (its first ACTIVE port)."""

    name: str
    link_layer: str = Field(description='"Ethernet" (RoCE) or "InfiniBand".')
    active: bool
    gids: tuple[GidFact, ...] = ()

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    @property
    def routable_v2_indices(self) -> frozenset[int]:
        return frozenset(g.index for g in self.gids if g.routable_v2)

    @property
    def ipv4_v2_indices(self) -> frozenset[int]:
        return frozenset(g.index for g in self.gids if g.ipv4_v2)


class HostFact(Strict):
    """What was found on one host."""

    name: str
    address: str = Field(description="The address the host had in the topology then.")
    network_interface: str | None = None
    rdma_devices: tuple[str, ...] = Field((), description="Devices with an ACTIVE port.")
    gpu_nics: dict[int, str] = Field(default_factory=dict, description="Proposed GPU -> NIC.")
    nics: tuple[NicFact, ...] = ()

    def nic(self, name: str) -> NicFact | None:
        return next((n for n in self.nics if n.name == name), None)


class DiscoveredFacts(Strict):
    """`pdkit discover`'s facts of a deployment's hosts."""

    hosts: tuple[HostFact, ...] = ()

    def host(self, name: str, address: str) -> HostFact | None:
        """The facts of host `name`, None when there are none or they were found at another
        address (stale)."""
        return next((h for h in self.hosts if h.name == name and h.address == address), None)


def facts_file(topology_file: Path, name: str, state_base: Path | str | None = None) -> Path:
    """Where `pdkit discover` keeps the facts of deployment `name` (its state dir)."""
    return state_dir(topology_file, name, state_base) / FACTS_FILE


def load_facts(path: Path) -> DiscoveredFacts | None:
    """The facts saved at `path`; None when there is no such file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return DiscoveredFacts.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        problem = Problem(
            (),
            f"{path} is not `pdkit discover`'s facts ({exc}).",
            "run `pdkit discover` again, or delete the file.",
        )
        raise TopologyError([problem]) from exc


def save_facts(path: Path, facts: DiscoveredFacts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(facts.model_dump_json(indent=2) + "\n")


def common_gid_index(nics: Sequence[tuple[str, NicFact]]) -> tuple[int | None, str]:
    """The GID index for the RoCE NICs among `nics` ((host, nic) pairs), and a note: the lowest
    IPv4-mapped RoCE v2 index all of them have, else the lowest routable RoCE v2 one; None
    when none is RoCE (InfiniBand needs no index) or none is common (the note lists each)."""
    roce = [(host, nic) for host, nic in nics if nic.roce]
    if not roce:
        return None, "no RoCE NIC chosen: no GID index needed" if nics else "no RDMA NIC"
    ipv4 = frozenset.intersection(*(nic.ipv4_v2_indices for _, nic in roce))
    if ipv4:
        return min(ipv4), f"RoCE v2, IPv4-mapped, present on all {len(roce)} chosen NIC(s)"
    routable = frozenset.intersection(*(nic.routable_v2_indices for _, nic in roce))
    if routable:
        return min(routable), f"RoCE v2, routable, present on all {len(roce)} chosen NIC(s)"
    each = "; ".join(
        f"{host}/{nic.name}: {sorted(nic.routable_v2_indices) or 'none'}" for host, nic in roce
    )
    return None, (
        "no routable RoCE v2 GID index is common to the chosen NICs (per NIC: "
        f"{each}); MC_GID_INDEX is one value per deployment, so align the GID tables"
    )


def worker_hosts(topology: Topology) -> list[Host]:
    """The hosts that may run workers: those the roles pin, else every GPU host."""
    pinned = {name for role in (topology.prefill, topology.decode) for name in role.hosts}
    return [h for h in topology.hosts if (h.name in pinned if pinned else h.gpus > 0)]


def used_nics(topology: Topology, facts: DiscoveredFacts) -> list[tuple[str, NicFact]]:
    """(host, facts of the NIC) for each RDMA device the workers' hosts would use."""
    found = []
    for host in worker_hosts(topology):
        fact = facts.host(host.name, host.address)
        choice = choose_nics(topology, host, tuple(range(host.gpus)))
        if fact is None or choice is None:
            continue
        found += [(host.name, nic) for d in choice.devices if (nic := fact.nic(d)) is not None]
    return found


def _host_fields(host: Host, fact: HostFact) -> tuple[dict[str, object], list[str]]:
    update: dict[str, object] = {}
    notes = []
    if host.network_interface is None and fact.network_interface:
        update["network_interface"] = fact.network_interface
        notes.append(f"hosts[{host.name}].network_interface: {fact.network_interface}")
    if host.device == "cpu" or host.gpus == 0:
        return update, notes
    devices = host.rdma_devices
    if not devices and fact.rdma_devices:
        devices = update["rdma_devices"] = fact.rdma_devices
        notes.append(f"hosts[{host.name}].rdma_devices: [{', '.join(devices)}]")
    nics = {g: n for g, n in fact.gpu_nics.items() if g < host.gpus and n in devices}
    # Only a map of every GPU: a partial one would leave some GPUs' transfers without a NIC.
    if not host.gpu_nics and len(nics) == host.gpus:
        update["gpu_nics"] = nics
        pairs = ", ".join(f"{g}: {n}" for g, n in sorted(nics.items()))
        notes.append(f"hosts[{host.name}].gpu_nics: {{{pairs}}}")
    return update, notes


def with_facts(topology: Topology, facts: DiscoveredFacts | None) -> tuple[Topology, list[str]]:
    """The topology with what it leaves out taken from `facts` (see the module doc), and one
    line per field taken (``hosts[a].network_interface: eth0``)."""
    if facts is None:
        return topology, []
    hosts, notes = [], []
    for host in topology.hosts:
        fact = facts.host(host.name, host.address)
        update, taken = _host_fields(host, fact) if fact else ({}, [])
        hosts.append(host.model_copy(update=update) if update else host)
        notes += taken
    topology = topology.model_copy(update={"hosts": tuple(hosts)})
    transfer = topology.transfer
    if transfer.gid_index is None and transfer.backend in RDMA_BACKENDS:
        index, why = common_gid_index(used_nics(topology, facts))
        if index is not None:
            transfer = transfer.model_copy(update={"gid_index": index})
            topology = topology.model_copy(update={"transfer": transfer})
            notes.append(f"transfer.gid_index: {index} ({why})")
    return topology, notes


def _rdma_sglang(topology: Topology) -> bool:
    return topology.engine == "sglang" and topology.transfer.backend in RDMA_BACKENDS


def gid_problems(topology: Topology, facts: DiscoveredFacts | None) -> list[Problem]:
    """A RoCE fabric (transfer.fabric, else a used NIC the facts say is Ethernet) with no GID
    index: every engine falls back to its own (Mooncake to 3), and transfers fail when that
    one is not the routable RoCE v2 GID."""
    transfer = topology.transfer
    if not _rdma_sglang(topology) or transfer.gid_index is not None:
        return []
    nics = used_nics(topology, facts) if facts else []
    if transfer.fabric != "roce" and not any(nic.roce for _, nic in nics):
        return []
    _, why = common_gid_index(nics) if nics else (None, "")
    found = f" `pdkit discover`'s facts have none to take: {why}." if why else ""
    return [
        Problem(
            ("transfer", "gid_index"),
            "the workers' RDMA NICs are RoCE (Ethernet) and no GID index is set: Mooncake falls "
            "back to index 3 and NCCL and NVSHMEM to their own, and a transfer on a GID that is "
            f'not the routable RoCE v2 one fails ("GID is NULL").{found}',
            "set transfer.gid_index to the RoCE v2 index whose GID holds the host's IPv4 "
            "address on every worker NIC (`show_gids`), or run `pdkit discover T`, which "
            "records the GID tables and fills it in.",
        )
    ]


def fabric_warnings(topology: Topology, facts: DiscoveredFacts | None) -> list[Problem]:
    """An RDMA backend on engine sglang whose NICs' link layer nothing says (no
    transfer.fabric, no GID index, no discovered facts of the workers' NICs)."""
    transfer = topology.transfer
    if not _rdma_sglang(topology) or transfer.gid_index is not None or transfer.fabric:
        return []
    if facts and used_nics(topology, facts):
        return []
    return [
        Problem(
            ("transfer", "backend"),
            f"{transfer.backend} moves KV over RDMA, and nothing says whether the NICs are "
            "InfiniBand or RoCE: on RoCE a missing GID index fails transfers.",
            "run `pdkit discover T` (it records the NICs and fills transfer.gid_index), or set "
            "transfer.fabric: infiniband, or transfer.gid_index on RoCE.",
        )
    ]
