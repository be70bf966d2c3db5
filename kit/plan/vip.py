"""The router's virtual IP (`router.vip`): keepalived's configuration on each router host,
rendered here, pure (the playbook writes it as it is; `kit.hosts.inventory` hands it over).

1. Each replica host runs keepalived with one VRRP instance: the first host of
   `router.hosts` has the highest priority, so it holds the address while it is healthy.
2. Adverts go by unicast to the other replicas (networks and namespaces without multicast).
3. A health check (`curl` of the local router's /health, every `check_interval_s`) that fails
   `check_failures` times in a row puts the instance in FAULT: it gives the address away at
   once; a host that dies stops advertising and a backup takes it after about 3 adverts.
"""

from __future__ import annotations

from kit.net import http_url
from kit.topology.layout import HostLayout
from kit.topology.plan_types import KeepalivedReplica, RouterVipPlan
from kit.topology.router_ha import RouterVip
from kit.topology.schema import Topology

TOP_PRIORITY = 150
"""The first replica's VRRP priority; each next one 10 lower."""
CHECK_TIMEOUT_S = 1
"""Seconds one health check of the local router may take."""


def build_router_vip(topology: Topology, layouts: dict[str, HostLayout]) -> RouterVipPlan | None:
    """keepalived's side of a validated topology with `router.vip`, else None."""
    router, vip = topology.router, topology.router.vip
    if vip is None or not router.hosts:
        return None
    addresses = {name: topology.host(name).address for name in router.hosts}
    replicas = []
    for i, name in enumerate(router.hosts):
        priority = TOP_PRIORITY - 10 * i
        peers = [addresses[other] for other in router.hosts if other != name]
        replicas.append(
            KeepalivedReplica(
                host=name,
                address=addresses[name],
                priority=priority,
                config_path=layouts[name].keepalived_conf,
                run_dir=layouts[name].run_dir,
                config=keepalived_conf(topology, vip, name, priority, peers),
            )
        )
    return RouterVipPlan(
        address=vip.address,
        interface=vip.interface,
        virtual_router_id=vip.virtual_router_id,
        replicas=tuple(replicas),
    )


def keepalived_conf(
    topology: Topology, vip: RouterVip, host: str, priority: int, peers: list[str]
) -> str:
    """keepalived.conf for the router replica on `host` (VRRP `priority`, the other
    replicas' addresses in `peers`)."""
    router, name = topology.router, topology.name
    address = topology.host(host).address
    tls = router.tls is not None
    health = http_url("127.0.0.1", router.port, "/health", tls=tls)
    insecure = "-k " if tls else ""  # the certificate names the VIP, not 127.0.0.1
    script = f"/usr/bin/curl -fsS {insecure}-m {CHECK_TIMEOUT_S} -o /dev/null {health}"
    peer_lines = "".join(f"        {peer}\n" for peer in peers)
    return (
        f"# Managed by pdkit: the router's virtual IP of deployment {name} (router.vip).\n"
        "global_defs {\n"
        f"    router_id pdkit-{name}-{host}\n"
        "    vrrp_version 3\n"
        "    enable_script_security\n"
        "    script_user nobody\n"
        "}\n"
        "\n"
        f"vrrp_script pdkit_{name}_router {{\n"
        f'    script "{script}"\n'
        f"    interval {vip.check_interval_s:g}\n"
        f"    timeout {CHECK_TIMEOUT_S}\n"
        f"    fall {vip.check_failures}\n"
        "    rise 2\n"
        "}\n"
        "\n"
        f"vrrp_instance pdkit_{name} {{\n"
        f"    state {'MASTER' if priority == TOP_PRIORITY else 'BACKUP'}\n"
        f"    interface {vip.interface}\n"
        f"    virtual_router_id {vip.virtual_router_id}\n"
        f"    priority {priority}\n"
        f"    advert_int {vip.advert_interval_s:g}\n"
        f"    unicast_src_ip {address}\n"
        "    unicast_peer {\n"
        f"{peer_lines}"
        "    }\n"
        "    virtual_ipaddress {\n"
        f"        {vip.address} dev {vip.interface}\n"
        "    }\n"
        "    track_script {\n"
        f"        pdkit_{name}_router\n"
        "    }\n"
        "}\n"
    )
