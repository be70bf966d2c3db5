"""`pdkit discover`: what each host has, and the topology fields that follow from it.

playbooks/discover.yml runs over the same inventory as provisioning and reads, per host, the
GPUs (nvidia-smi: name, PCI bus id) with their NUMA node and PCI path, and the RDMA devices
with link layer, state, rate, NUMA node, PCI path and GID table (sysfs). From that, pure
functions here propose, per host:

- `gpus` and `gpu_type` (the performance model's name when it knows the GPU);
- `rdma_devices`: the devices with an ACTIVE port;
- `gpu_nics`: each GPU's closest active NIC: one under the same PCIe switch (the deepest
  bridge they share lies below the root port), else one on the same NUMA node, else any; ties
  go to the NIC with the fewest GPUs so far, so that two GPUs per NIC spread evenly;

and for the deployment a RoCE v2 `transfer.gid_index` that is routable (not link-local fe80::)
and present on every chosen NIC of every host (none is needed when all of them are InfiniBand).
`--write FILE` writes the topology with these fields (kit.topology.edit keeps the comments).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.playbook import failure_report, run_playbook
from kit.hosts.progress import AnsibleView
from kit.hosts.provision import FactsCollector
from kit.hosts.state_dir import display_path
from kit.perf.gpus import UnknownGpuError, gpu_spec
from kit.topology.edit import HostFields, edit_topology
from kit.topology.facts import FACTS_FILE, DiscoveredFacts, HostFact, NicFact, save_facts
from kit.topology.facts import GidFact as Gid
from kit.topology.facts import common_gid_index as roce_gid_index
from kit.topology.load import parse_topology, read_topology_text
from kit.topology.schema import Topology

FACT = "pdkit_discover_facts"

# -- facts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    numa: int
    pci_path: tuple[str, ...]

    @property
    def switch(self) -> str | None:
        """The PCIe switch above the GPU (its upstream port), when there is one between the
        root port and the GPU."""
        return self.pci_path[2] if len(self.pci_path) >= 4 else None


@dataclass(frozen=True)
class Nic:
    name: str
    numa: int
    pci_path: tuple[str, ...]
    active: bool
    state: str
    link_layer: str
    rate: str
    gids: tuple[Gid, ...]

    def fact(self) -> NicFact:
        """What the topology's later commands keep of it (`kit.topology.facts`)."""
        return NicFact(
            name=self.name, link_layer=self.link_layer, active=self.active, gids=self.gids
        )

    @property
    def roce(self) -> bool:
        return self.fact().roce

    @property
    def routable_v2_indices(self) -> frozenset[int]:
        return self.fact().routable_v2_indices


@dataclass(frozen=True)
class HostFacts:
    host: str
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    numa_nodes: int
    gpu_error: str = ""
    gpudirect: Mapping[str, Any] = field(default_factory=dict)
    network_interface: str | None = None
    """The interface that carries the host's address (`ip -o addr show to ADDRESS`)."""

    @classmethod
    def parse(cls, host: str, data: Mapping[str, Any]) -> HostFacts:
        """From the `pdkit_discover_facts` fact (gpu_topology.py + rdma_facts.py output)."""
        gpus_fact, rdma = data.get("gpus") or {}, data.get("rdma") or {}
        gpus = tuple(
            Gpu(int(g["index"]), str(g["name"]), int(g["numa_node"]), tuple(g["pci_path"]))
            for g in gpus_fact.get("gpus", [])
        )
        nics = []
        for d in rdma.get("devices", []):
            port = next((p for p in d.get("ports", []) if p.get("active")), None)
            port = port or (d.get("ports") or [{}])[0]
            nics.append(
                Nic(
                    name=str(d["name"]),
                    numa=int(d.get("numa_node", -1)),
                    pci_path=tuple(d.get("pci_path", [])),
                    active=bool(d.get("active")),
                    state=str(port.get("state", "")),
                    link_layer=str(port.get("link_layer", "")),
                    rate=str(port.get("rate", "")),
                    gids=tuple(
                        Gid(index=int(g["index"]), gid=str(g["gid"]), kind=str(g.get("type", "")))
                        for g in port.get("gids", [])
                    ),
                )
            )
        return cls(
            host=host,
            gpus=gpus,
            nics=tuple(nics),
            numa_nodes=int(gpus_fact.get("numa_nodes", 1)),
            gpu_error="" if gpus_fact.get("ok", True) else str(gpus_fact.get("error", "")),
            gpudirect=rdma.get("gpudirect") or {},
            network_interface=address_interface(str(data.get("address") or "")),
        )


def address_interface(ip_output: str) -> str | None:
    """The interface of `ip -o addr show to ADDRESS`'s first line (``2: eth0    inet ...``;
    a VLAN's ``eth0.100@eth0`` is ``eth0.100``), None when the address is on none."""
    for line in ip_output.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            return fields[1].split("@", 1)[0].rstrip(":") or None
    return None


# -- proposal -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NicPick:
    """Why a GPU got its NIC."""

    gpu: int
    nic: str
    why: str


@dataclass(frozen=True)
class HostProposal:
    host: str
    gpus: int
    gpu_type: str | None
    rdma_devices: tuple[str, ...]
    gpu_nics: dict[int, str]
    picks: tuple[NicPick, ...]
    network_interface: str | None = None

    def fields(self) -> HostFields:
        """The topology fields of the host (gpu_type, the interface and the NIC fields only
        when known)."""
        out: HostFields = {"gpus": self.gpus}
        if self.gpu_type:
            out["gpu_type"] = self.gpu_type
        if self.network_interface:
            out["network_interface"] = self.network_interface
        if self.rdma_devices:
            out["rdma_devices"] = list(self.rdma_devices)
        if self.gpu_nics:
            out["gpu_nics"] = dict(self.gpu_nics)
        return out


@dataclass(frozen=True)
class Proposal:
    hosts: tuple[HostProposal, ...]
    gid_index: int | None
    gid_note: str


GPU_TYPES = (
    ("H200", "H200"),
    ("H100", "H100-SXM"),
    ("B200", "B200"),
    ("L40S", "L40S"),
    ("A100-SXM4-80GB", "A100-80G"),
    ("A100 80GB", "A100-80G"),
    ("A100-SXM4-40GB", "A100-40G"),
    ("A100", "A100-80G"),
)
"""nvidia-smi names -> the performance model's GPU names (first match wins)."""


def gpu_type(name: str) -> str:
    """The `gpu_type` for an nvidia-smi name: the performance model's name when it knows the
    GPU ("NVIDIA H100 80GB HBM3" -> "H100-SXM"), else the name without "NVIDIA "."""
    for marker, known in GPU_TYPES:
        if marker.upper() in name.upper():
            return known
    bare = name.removeprefix("NVIDIA ").strip()
    try:
        return gpu_spec(bare).name
    except UnknownGpuError:
        return bare


def _shared(a: Sequence[str], b: Sequence[str]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def closest_nic(gpu: Gpu, nics: Sequence[Nic], load: Mapping[str, int]) -> NicPick | None:
    """The active NIC closest to `gpu` (see the module doc), or None without one."""
    best: tuple[tuple[int, int, int, int], Nic] | None = None
    for nic in nics:
        if not nic.active:
            continue
        shared = _shared(gpu.pci_path, nic.pci_path)
        same_switch = int(shared >= 3)  # root complex, root port, then a switch's bridge
        key = (same_switch, int(gpu.numa == nic.numa and gpu.numa >= 0), shared, -load[nic.name])
        if best is None or key > best[0]:
            best = (key, nic)
    if best is None:
        return None
    (same_switch, same_numa, shared, _), nic = best
    if same_switch:
        why = f"same PCIe switch {gpu.pci_path[shared - 1]}"
    elif same_numa:
        why = f"same NUMA node {gpu.numa}"
    else:
        why = "no NIC on its PCIe switch or NUMA node: the nearest there is"
    return NicPick(gpu.index, nic.name, why)


def propose_host(facts: HostFacts) -> HostProposal:
    load = {nic.name: 0 for nic in facts.nics}
    picks = []
    for gpu in sorted(facts.gpus, key=lambda g: g.index):
        pick = closest_nic(gpu, facts.nics, load)
        if pick is not None:
            load[pick.nic] += 1
            picks.append(pick)
    names = {g.name for g in facts.gpus}
    return HostProposal(
        host=facts.host,
        gpus=len(facts.gpus),
        gpu_type=gpu_type(sorted(names)[0]) if len(names) == 1 else None,
        rdma_devices=tuple(sorted(n.name for n in facts.nics if n.active)),
        gpu_nics={p.gpu: p.nic for p in picks},
        picks=tuple(picks),
        network_interface=facts.network_interface,
    )


def common_gid_index(
    facts: Sequence[HostFacts], proposals: Sequence[HostProposal]
) -> tuple[int | None, str]:
    """The GID index every chosen NIC has (`kit.topology.facts.common_gid_index`: IPv4-mapped
    RoCE v2 first), and a note; None when no RoCE NIC is chosen or none is common."""
    by_host = {f.host: {n.name: n for n in f.nics} for f in facts}
    chosen = [
        (p.host, by_host[p.host][name].fact())
        for p in proposals
        for name in sorted(set(p.gpu_nics.values()) or set(p.rdma_devices))
    ]
    return roce_gid_index(chosen)


def propose(facts: Sequence[HostFacts]) -> Proposal:
    hosts = tuple(propose_host(f) for f in facts)
    index, note = common_gid_index(facts, hosts)
    return Proposal(hosts, index, note)


# -- command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiscoverOptions:
    write: Path | None = None
    as_json: bool = False
    extra_vars: Mapping[str, Any] = field(default_factory=dict)
    verbose: bool = False


def gather(ctx: DeployContext, console: Console, options: DiscoverOptions) -> list[HostFacts]:
    """Run discover.yml on every host; each host's facts (raise `DeployError` on failure)."""
    inventory = ctx.inventory()
    hosts: dict[str, dict[str, Any]] = inventory["all"]["children"]["pdkit_hosts"]["hosts"]
    for name in hosts:
        hosts[name] |= dict(options.extra_vars)
    with AnsibleView(console) as view:
        collector = FactsCollector(view, names=(FACT,))
        result = run_playbook(
            ctx.private_dir,
            inventory,
            "discover.yml",
            listener=collector.listener,
            verbose=options.verbose,
        )
    if not result.ok:
        raise DeployError(failure_report(result))
    missing = [h.name for h in ctx.hosts if FACT not in collector.facts.get(h.name, {})]
    if missing:
        raise DeployError(f"discover.yml returned no facts for {', '.join(missing)}.")
    return [HostFacts.parse(h.name, collector.facts[h.name][FACT]) for h in ctx.hosts]


def differences(topology: Topology, proposal: Proposal) -> list[str]:
    """What the proposal changes in the topology, one line per field."""
    lines = []
    for hp in proposal.hosts:
        host = topology.host(hp.host)
        current: dict[str, Any] = {
            "gpus": host.gpus,
            "gpu_type": host.gpu_type,
            "rdma_devices": list(host.rdma_devices),
            "gpu_nics": dict(host.gpu_nics),
            "network_interface": host.network_interface,
        }
        for key, value in hp.fields().items():
            if current[key] != value:
                lines.append(f"hosts[{hp.host}].{key}: {_flow(current[key])} -> {_flow(value)}")
    if proposal.gid_index is not None and topology.transfer.gid_index != proposal.gid_index:
        lines.append(
            f"transfer.gid_index: {_flow(topology.transfer.gid_index)} -> {proposal.gid_index}"
        )
    return lines


def _flow(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def facts_lines(facts: HostFacts, proposal: HostProposal) -> list[str]:
    """What was found on one host, for a reader."""
    names = sorted({g.name for g in facts.gpus})
    if facts.gpu_error:
        gpus = f"no GPU read ({facts.gpu_error})"
    else:
        gpus = f"{len(facts.gpus)} GPU(s) {', '.join(names) or ''}".rstrip()
    gd = facts.gpudirect
    direct = (
        "nvidia_peermem" if gd.get("nvidia_peermem") else "dma-buf" if gd.get("dmabuf") else "no"
    )
    interface = facts.network_interface or "not found"
    lines = [
        f"{facts.host}: {gpus}; {facts.numa_nodes} NUMA node(s); GPUDirect RDMA: {direct}; "
        f"interface of its address: {interface}",
    ]
    for nic in facts.nics:
        v2 = sorted(nic.routable_v2_indices)
        gids = f", routable RoCE v2 GIDs at {v2}" if nic.roce else ""
        lines.append(
            f"  {nic.name}: {nic.state or '?'} {nic.link_layer or '?'} {nic.rate or '?'}, "
            f"NUMA {nic.numa}{gids}"
        )
    picks = {p.gpu: p for p in proposal.picks}
    for gpu in facts.gpus:
        pick = picks.get(gpu.index)
        to = f" -> {pick.nic} ({pick.why})" if pick else " -> no active NIC"
        lines.append(f"  GPU {gpu.index}: NUMA {gpu.numa}, PCIe switch {gpu.switch or '-'}{to}")
    return lines


def discover(ctx: DeployContext, console: Console, options: DiscoverOptions) -> Proposal:
    """`pdkit discover`: gather, propose, print (text or JSON), write the topology if asked."""
    if not options.as_json:
        console.print(
            f"[bold]pdkit discover {escape(ctx.plan.name)}[/]: {len(ctx.hosts)} host(s) "
            "(Ansible, discover.yml: read-only)"
        )
    facts = gather(ctx, console if not options.as_json else Console(quiet=True), options)
    proposal = propose(facts)
    text = read_topology_text(ctx.topology_file)
    topology, _ = parse_topology(text, str(ctx.topology_file))
    save_facts(ctx.state_dir / FACTS_FILE, kept_facts(topology, facts, proposal))
    changes = differences(topology, proposal)
    if options.as_json:
        console.print(
            json.dumps(_json(facts, proposal, changes), indent=2),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    else:
        _print(console, facts, proposal, changes)
    if options.write is not None:
        host_fields = {hp.host: hp.fields() for hp in proposal.hosts}
        transfer = {"gid_index": proposal.gid_index} if proposal.gid_index is not None else {}
        options.write.write_text(edit_topology(text, host_fields, transfer))
        if not options.as_json:
            console.print(f"Wrote {options.write} (comments kept).", markup=False)
    if not options.as_json:
        console.print(
            f"Kept in {display_path(ctx.state_dir / FACTS_FILE)}: later commands take the "
            "interface, NIC map and GID index from it where the topology leaves them out.",
            markup=False,
        )
    return proposal


def kept_facts(
    topology: Topology, facts: Sequence[HostFacts], proposal: Proposal
) -> DiscoveredFacts:
    """What the topology's later commands take from this discovery (`kit.topology.facts`)."""
    return DiscoveredFacts(
        hosts=tuple(
            HostFact(
                name=f.host,
                address=topology.host(f.host).address,
                network_interface=f.network_interface,
                rdma_devices=hp.rdma_devices,
                gpu_nics=hp.gpu_nics,
                nics=tuple(n.fact() for n in f.nics),
            )
            for f, hp in zip(facts, proposal.hosts, strict=True)
        )
    )


def _print(
    console: Console, facts: Sequence[HostFacts], proposal: Proposal, changes: list[str]
) -> None:
    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    for host_facts, hp in zip(facts, proposal.hosts, strict=True):
        for line in facts_lines(host_facts, hp):
            say(line)
    say("Proposed:")
    for hp in proposal.hosts:
        fields = ", ".join(f"{k}: {_flow(v)}" for k, v in hp.fields().items())
        say(f"  hosts[{hp.host}]: {fields}")
    index = "unset" if proposal.gid_index is None else str(proposal.gid_index)
    say(f"  transfer.gid_index: {index} ({proposal.gid_note})")
    if changes:
        say("Differences from the topology:")
        for line in changes:
            say(f"  {line}")
    else:
        say("The topology already says all of this.")


def _json(facts: Sequence[HostFacts], proposal: Proposal, changes: list[str]) -> dict[str, Any]:
    return {
        "hosts": [
            {
                "name": f.host,
                "numa_nodes": f.numa_nodes,
                "gpudirect": dict(f.gpudirect),
                "gpus": [
                    {"index": g.index, "name": g.name, "numa_node": g.numa, "pcie_switch": g.switch}
                    for g in f.gpus
                ],
                "rdma_devices": [
                    {
                        "name": n.name,
                        "state": n.state,
                        "link_layer": n.link_layer,
                        "rate": n.rate,
                        "numa_node": n.numa,
                        "routable_roce_v2_gids": sorted(n.routable_v2_indices),
                    }
                    for n in f.nics
                ],
                "proposed": {k: v for k, v in hp.fields().items()},
                "why": {str(p.gpu): p.why for p in hp.picks},
            }
            for f, hp in zip(facts, proposal.hosts, strict=True)
        ],
        "gid_index": proposal.gid_index,
        "gid_note": proposal.gid_note,
        "differences": changes,
    }
