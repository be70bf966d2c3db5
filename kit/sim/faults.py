"""PDKIT_SIM_FAULT: a sim worker whose KV transfers fail the way a real worker's do, with the log
lines the real system writes, so that `pdkit doctor` and `pdkit up`'s gate meet on the sim the
failures they diagnose on SGLang.

``refuse``   prefill: its Mooncake write goes to port 1 of the decode's host, where nothing
             listens, so the transfer engine itself logs ``SocketHandShakePlugin:
             connect()HOST:1: Connection refused [111]`` and the prefill logs SGLang's
             ``Failed to send kv chunk of ROOM to ...``; decode: it advertises such a session,
             so its prefill's write is refused the same way (a firewalled Mooncake RPC port).
``hang``     prefill: it holds the KV and never writes it, until the decode gives up; decode:
             it never asks for the KV and gives up after SGLANG_DISAGGREGATION_WAITING_TIMEOUT
             with SGLang's ``Request ROOM timed out after Ns in KVPoll.WaitingForInput``.
``corrupt``  one byte of the KV is flipped (prefill: in what it sends; decode: in what it
             received). As in SGLang, what follows depends on
             ``--disaggregation-enable-kv-checksum`` (off by default): without it the decode
             decodes from the altered KV and answers 200 with fluent, wrong tokens (the first
             one, the prefill's, is right), writing nothing (sglang #12157: a wrong KV layout
             looks like this); with it on both roles the decode logs SGLang's ``KV checksum
             mismatch req=... bootstrap_room=... expected=0x... got=0x...`` and fails the
             request with 500 "KV checksum mismatch" (srt/disaggregation/decode.py:3332).

A fault is set at start (PDKIT_SIM_FAULT) or while the worker runs, on the emulator's own route
(not SGLang's): ``POST /sim/fault`` with ``{"fault": "corrupt"}`` (``null`` turns it off), for
failures that appear after hours of serving (the router's token canary, kit.lb.canary).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kit.sim.bootstrap import Reservation
from kit.sim.pd_client import PdError
from kit.sim.transfer import KvBuffer, TransferError

FAULT_ROUTE = "/sim/fault"
REFUSED_PORT = 1
"""A port nothing listens on (tcpmux): a connection there is refused at once."""


def refused(session: str) -> str:
    """A Mooncake session (host:port) on the same host whose port refuses connections."""
    host = session.rsplit(":", 1)[0]
    return f"{host}:{REFUSED_PORT}"


async def before_send(
    fault: str | None, kv: KvBuffer, reservation: Reservation, pages: Sequence[int], length: int
) -> str:
    """The prefill's side, once its KV is in `pages`: the session to write to (refuse: a
    dead one), after holding the KV (hang) or flipping a byte of it (corrupt)."""
    if fault == "refuse":
        return refused(reservation.session)
    if fault == "hang":
        await asyncio.shield(reservation.result)  # done when the decode withdraws
        raise TransferError("the decode gave up waiting for the KV")
    if fault == "corrupt":
        kv.flip(pages, length)
    return reservation.session


def advertised(fault: str | None, session: str) -> str:
    """The session a decode gives its prefill (refuse: one whose port refuses)."""
    return refused(session) if fault == "refuse" else session


async def before_fetch(fault: str | None, room: int, waiting_timeout_s: float) -> None:
    """The decode's side, before it asks for the KV: hang waits out the waiting timeout and
    fails with SGLang's message."""
    if fault == "hang":
        await asyncio.sleep(waiting_timeout_s)
        raise PdError(
            f"Request {room} timed out after {waiting_timeout_s:.1f}s in KVPoll.WaitingForInput"
        )


def after_fetch(fault: str | None, kv: KvBuffer, pages: Sequence[int], length: int) -> None:
    """The decode's side, once the KV landed (corrupt: flip a byte of it)."""
    if fault == "corrupt":
        kv.flip(pages, length)
