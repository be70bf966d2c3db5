"""One client request in flight (`Exchange`): what the server needs to finish, count and log
it, and what the client is told about the path it took."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from kit.lb.admission import Ticket
from kit.lb.cache_aware import Choice
from kit.lb.openai_stream import IdStream
from kit.lb.protocol import PdRequest
from kit.lb.recent import PathRecord
from kit.lb.stream import StreamRelay

# Request ids taken from the client: visible ASCII without quotes or backslashes (they go into
# headers and the access log as they are), at most this long; others get a new id.
MAX_REQUEST_ID = 128


def client_request_id(value: str | None) -> str | None:
    """The client's X-Request-Id when it is usable as is, else None."""
    if (
        value
        and len(value) <= MAX_REQUEST_ID
        and value.isascii()
        and value.isprintable()
        and " " not in value
        and '"' not in value
        and "\\" not in value
    ):
        return value
    return None


@dataclass(slots=True)
class Exchange:
    """One client request in flight: what the server needs to finish, count and log it.

    Times are `time.monotonic()` seconds; durations of legs are seconds (None: not run)."""

    request: web.BaseRequest
    pd: PdRequest
    started: float
    request_id: str = ""
    path: PathRecord | None = None  # the prefill, decode and room chosen (last attempt)
    out: web.StreamResponse | None = None
    relay: StreamRelay | None = None
    # Metrics labels of what went wrong on the way (retries, a lost client...), counted once.
    causes: list[str] = field(default_factory=list)
    sent_at: float | None = None  # both legs of the last attempt were sent
    prefill_s: float | None = None
    prefill_end: float | None = None
    decode_s: float | None = None
    cause: str = ""  # why the request failed (a metrics cause), for the access log
    admission: str = "off"  # admitted, rejected:REASON, or off
    ticket: Ticket | None = None
    retries: int = 0  # attempts sent again on a fresh pair before the client got a byte
    migrations: int = 0  # times the stream was continued on another pair
    held_s: float = 0.0  # seconds spent waiting for a worker of a role with none routable
    kv: Choice | None = None  # cache_aware's choice for the last attempt
    claimed: bool = False  # holds a promised prefill slot (--prefill-max-inflight)
    cached_actual: int | None = None  # cached tokens the prefill reported (meta_info)
    poison: str = ""  # the body's fingerprint once a prefill died under it (kit.lb.poison)
    follow: IdStream | None = None  # an OpenAI stream whose ids the router follows (migration)


def path_headers(ex: Exchange) -> dict[str, str]:
    """The request id and the PD path chosen for it, for the client (`pdkit bench` records
    them; `GET /requests?id=` answers the same after the fact)."""
    headers = {"X-Request-Id": ex.request_id} if ex.request_id else {}
    if ex.path is not None:
        headers["X-PDKit-Prefill"] = ex.path.prefill
        headers["X-PDKit-Decode"] = ex.path.decode
        headers["X-PDKit-Bootstrap-Room"] = str(ex.path.bootstrap_room)
    kv = ex.kv
    if kv is not None:  # cache_aware: the rank chosen, and the cached tokens foreseen and seen
        if kv.dp_rank is not None:
            headers["X-PDKit-Prefill-DP-Rank"] = str(kv.dp_rank)
        if kv.predicted >= 0:
            headers["X-PDKit-Cached-Predicted"] = str(kv.predicted)
        if ex.cached_actual is not None:
            headers["X-PDKit-Cached-Actual"] = str(ex.cached_actual)
    return headers
