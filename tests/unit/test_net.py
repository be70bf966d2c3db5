"""Addresses and failed HTTP calls: one helper each, used by every layer."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from kit.net import bare_host, classify_failure, host_port, http_url, is_loopback, url_host


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("10.0.0.1", "http://10.0.0.1:30000"),
        ("gpu-a.example", "http://gpu-a.example:30000"),
        ("::1", "http://[::1]:30000"),
        ("[::1]", "http://[::1]:30000"),
        ("fd00::a:1", "http://[fd00::a:1]:30000"),
        (" [fd00::a:1] ", "http://[fd00::a:1]:30000"),
    ],
)
def test_addresses_meet_ports_with_ipv6_in_brackets_exactly_once(address, url):
    assert http_url(address, 30000) == url
    assert host_port(address, 30000) == url.removeprefix("http://")
    assert url_host(address) == url.removeprefix("http://").rsplit(":", 1)[0]
    assert "[" not in bare_host(address)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("localhost", True), ("[::1]", True), ("10.0.0.1", False), ("a", False)],
)
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_is_named_as_such():
    async def call() -> BaseException:
        async with aiohttp.ClientSession() as session:
            try:
                await session.get(f"http://127.0.0.1:{_closed_port()}/")
            except aiohttp.ClientError as exc:
                return exc
        raise AssertionError("the call succeeded")

    assert classify_failure(asyncio.run(call()), sent=False, timeout=1) == (
        "refused",
        "connection refused",
    )


def test_a_timeout_before_the_request_went_out_is_a_connect_timeout():
    kind, detail = classify_failure(TimeoutError(), sent=False, timeout=3.0)
    assert kind == "connect_timeout" and "host down" in detail
    assert classify_failure(TimeoutError(), sent=True, timeout=3.0) == (
        "timeout",
        "no answer within 3 s",
    )


def test_a_dropped_connection_is_broken():
    kind, detail = classify_failure(aiohttp.ServerDisconnectedError(), sent=True, timeout=1)
    assert kind == "broken" and "closed the connection" in detail
