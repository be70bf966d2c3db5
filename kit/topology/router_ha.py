"""Router replicas on several hosts behind a virtual IP (`router.hosts`, `router.vip`), and
TLS on its client port (`router.tls`): the schema. keepalived (Debian's package, VRRP between
the router hosts) holds the address on one host at a time and moves it when that host's router
stops answering its health check or the host dies. The Plan's side is `kit.plan.vip`."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from kit.topology.strict import Strict


class RouterVip(Strict):
    """The address clients use, held by keepalived on one router host at a time. A site with
    its own load balancer leaves `vip` out and points its balancer at every replica."""

    address: str = Field(
        description="The virtual IP with its prefix length, e.g. 10.0.0.100/24: on the router "
        "hosts' network, used by no host."
    )
    interface: str = Field(
        description="The network interface that carries it on every router host (e.g. eth0).",
        pattern=r"^[A-Za-z0-9_.:@-]{1,15}$",
    )
    virtual_router_id: int = Field(
        51,
        ge=1,
        le=255,
        description="VRRP router id: unique among the VRRP groups on that network.",
    )
    advert_interval_s: float = Field(
        0.5,
        ge=0.01,
        le=255,
        description="Seconds between VRRP adverts (VRRPv3: hundredths allowed); a backup "
        "takes the address about 3 of them after its host stops advertising.",
    )
    check_interval_s: float = Field(
        1.0,
        gt=0,
        description="Seconds between health checks of the local router (its /health).",
    )
    check_failures: int = Field(
        2,
        ge=1,
        description="Failed checks in a row that give the address away.",
    )

    @field_validator("address")
    @classmethod
    def _interface_address(cls, value: str) -> str:
        try:
            network = ipaddress.ip_interface(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not an address with a prefix length (e.g. 10.0.0.100/24)"
            ) from None
        if "/" not in value:
            raise ValueError(f"{value!r} needs its prefix length (e.g. {value}/24)")
        return str(network)


class RouterTls(Strict):
    """TLS on the router's client port (pdkit only): the files live on the router host and
    are read there, never put on a command line; `pdkit up` makes the router read them again
    (SIGHUP) without dropping connections. The control machine must trust the certificate
    (its system CA store, or SSL_CERT_FILE) for status, health and bench."""

    cert_file: str = Field(
        pattern=r"^/", description="PEM certificate chain, an absolute path on the router host."
    )
    key_file: str = Field(
        pattern=r"^/", description="PEM private key, an absolute path on the router host."
    )
