"""Addresses and failed HTTP calls: the one place for each basic every layer needs.

Hosts are IPv4 addresses, names, or IPv6 literals written with or without brackets
(``::1`` or ``[::1]``). Inside pdkit an address is kept bare (no brackets); brackets are added
only where an address meets a port:

    bare_host("[::1]")            -> "::1"
    host_port("::1", 30000)       -> "[::1]:30000"
    split_host_port("[::1]:30000") -> ("::1", 30000)
    http_url("10.0.0.1", 8000)    -> "http://10.0.0.1:8000"

`classify_failure` names why an HTTP call got no answer, in the same words wherever pdkit
reports it (readiness waits, status probes, the benchmark).
"""

from __future__ import annotations

import errno
import ipaddress
from typing import Literal

FailureKind = Literal["refused", "unreachable", "connect_timeout", "timeout", "broken", "skipped"]
"""Why no HTTP answer came: nothing listens at the port; no route to the host (or its name does
not resolve); the TCP connection did not open in time (host down or filtered); it opened but no
answer came in time (the process hangs); the connection broke mid-answer; not asked (a probe
called off because an earlier one to the same process got no answer)."""


def bare_host(address: str) -> str:
    """`address` without the brackets of an IPv6 literal ("[::1]" -> "::1"), trimmed."""
    address = address.strip()
    if address.startswith("[") and address.endswith("]"):
        return address[1:-1]
    return address


def is_ip(address: str) -> bool:
    """Whether `address` (bare or bracketed) is an IP literal rather than a name."""
    try:
        ipaddress.ip_address(bare_host(address))
    except ValueError:
        return False
    return True


def is_ipv6(address: str) -> bool:
    """Whether `address` (bare or bracketed) is an IPv6 literal."""
    try:
        return isinstance(ipaddress.ip_address(bare_host(address)), ipaddress.IPv6Address)
    except ValueError:
        return False


def url_host(address: str) -> str:
    """The host as it goes into a URL or a host:port pair: IPv6 literals in brackets."""
    bare = bare_host(address)
    return f"[{bare}]" if ":" in bare else bare


def host_port(address: str, port: int) -> str:
    """``host:port`` with an IPv6 literal in brackets ("[::1]:30000")."""
    return f"{url_host(address)}:{port}"


def split_host_port(text: str) -> tuple[str, int]:
    """``host:port`` -> (bare host, port): the inverse of `host_port` ("[::1]:29500" ->
    ("::1", 29500)); ValueError when there is no port number after the last colon."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {text!r}")
    return bare_host(host), int(port)


def http_url(address: str, port: int, path: str = "", *, tls: bool = False) -> str:
    """``http://host:port[path]`` (``https://`` with `tls`) with an IPv6 literal in brackets."""
    return f"{'https' if tls else 'http'}://{host_port(address, port)}{path}"


def is_loopback(address: str) -> bool:
    """Whether `address` can only be reached from its own machine (localhost, 127/8, ::1)."""
    if bare_host(address) == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare_host(address)).is_loopback
    except ValueError:
        return False


def classify_failure(exc: BaseException, sent: bool, timeout: float) -> tuple[FailureKind, str]:
    """Why an HTTP call raised `exc`: its kind and a short phrase for the user.

    `sent` says whether the request had gone out (a timeout after that is a silent process, one
    before it a host that does not accept the connection); `timeout` is the seconds allowed.
    """
    import aiohttp  # noqa: PLC0415 (only callers that made HTTP calls get here)

    if isinstance(exc, TimeoutError):
        if sent:
            return "timeout", f"no answer within {timeout:g} s"
        return "connect_timeout", f"no TCP connection within {timeout:g} s (host down?)"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "unreachable", f"cannot resolve the host ({exc.os_error})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = exc.os_error
        if error.errno == errno.ECONNREFUSED or isinstance(error, ConnectionRefusedError):
            return "refused", "connection refused"
        return "unreachable", f"cannot connect: {(error.strerror or str(error)).lower()}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "broken", "closed the connection without answering"
    if isinstance(exc, ConnectionRefusedError):
        return "refused", "connection refused"
    return "broken", f"{type(exc).__name__}: {exc}".rstrip(": ")
