"""Every port a worker process listens on, the ones SGLang takes without a flag included.

SGLang 0.5.23 binds more than `--port` and `--disaggregation-bootstrap-port` (reference
sglang-pd.md section 9): torch's rendezvous at the dist-init port, and with DP attention its ZMQ
sockets over TCP in the block after it (`--port` + 233 .. without --dist-init-addr) and the DP
controller's handshake at dist-init + 13; Mooncake's transfer engine takes an RPC port in
15000-17000. Validation claims these ports (no two listeners of one address share one) and the
Plan carries them (`WorkerProcess.ports`), so the firewall rules are read from the Plan.
"""

from __future__ import annotations

from kit.topology import ports
from kit.topology.place import InstancePlacement, Node
from kit.topology.plan_types import PortUse
from kit.topology.schema import RoleSpec, Topology

CLIENTS = "clients"
DECODE_HOSTS = "decode hosts"
INSTANCE_NODES = "instance nodes"
PEER_HOSTS = "peer hosts"
LOCAL = "local"


def process_ports(topology: Topology, p: InstancePlacement, node: Node) -> tuple[PortUse, ...]:
    """The ports the process of `p` on `node` listens on, HTTP first."""
    spec: RoleSpec = getattr(topology, p.role)
    attention_dp = spec.parallelism.attention_dp
    used = [PortUse(first=p.http_port, last=p.http_port, what="HTTP", reached_by=CLIENTS)]
    if p.bootstrap_port is not None:
        used.append(
            PortUse(
                first=p.bootstrap_port,
                last=p.bootstrap_port,
                what="bootstrap",
                reached_by=DECODE_HOSTS,
            )
        )
    if p.kv_events_port is not None and node.rank == 0:
        dp = spec.dp
        used.append(
            PortUse(
                first=p.kv_events_port,
                last=p.kv_events_port + dp - 1,
                what="KV events",
                reached_by=CLIENTS,
            )
        )
    if p.nccl_port is not None:  # pdkit assigns it, so that SGLang picks none at random
        used.append(PortUse(first=p.nccl_port, last=p.nccl_port, what="NCCL", reached_by=LOCAL))
    if node.rank == 0:
        reach = INSTANCE_NODES if p.nnodes > 1 else LOCAL
        block = ports.dist_init_ports(p.http_port, p.dist_init_port, attention_dp)
        if block:
            what = "dist-init and DP attention's ZMQ" if attention_dp else "dist-init"
            used.append(PortUse(first=block[0], last=block[-1], what=what, reached_by=reach))
        if p.nnodes > 1 and p.dist_init_port is not None and topology.launcher != "slurm":
            group = ports.rank_group_port(p.dist_init_port)
            used.append(PortUse(first=group, last=group, what="rank group", reached_by=reach))
        if attention_dp:
            handshake = ports.dp_handshake_port(p.http_port, p.dist_init_port)
            used.append(
                PortUse(first=handshake, last=handshake, what="DP handshake", reached_by=reach)
            )
    if topology.transfer.backend != "nixl":
        rpc = ports.MOONCAKE_RPC
        used.append(PortUse(first=rpc[0], last=rpc[-1], what="Mooncake RPC", reached_by=PEER_HOSTS))
    return tuple(used)
