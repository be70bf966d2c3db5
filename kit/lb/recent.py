"""The PD path of recent requests: which prefill and decode a request went to, with which
bootstrap room, and how it ended. Clients read it with `GET /requests?id=REQUEST_ID` (their API
key), so that a client whose request timed out, with no answer and so no response headers, can
still learn where it was stuck (`pdkit bench` does this for every failed request).

Bounded: the oldest entries go first once `capacity` requests are remembered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kit.lb.errors import ApiError

DEFAULT_CAPACITY = 10_000


@dataclass(slots=True)
class PathRecord:
    """Where one request went; `status` is None while it is in flight (0: the client left)."""

    request_id: str
    route: str
    prefill: str
    decode: str
    bootstrap_room: int
    started: float
    status: int | None = None
    ended: float | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "route": self.route,
            "prefill": self.prefill,
            "decode": self.decode,
            "bootstrap_room": self.bootstrap_room,
            "state": "in_flight" if self.status is None else "done",
            "status": self.status,
            "seconds": round((self.ended or now) - self.started, 3),
        }


class RecentRequests:
    """The last `capacity` requests' paths, by request id (monotonic clock times)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._records: OrderedDict[str, PathRecord] = OrderedDict()

    def chose(self, record: PathRecord) -> None:
        """A prefill and decode were chosen for a request (a retry replaces the first choice)."""
        records = self._records
        records[record.request_id] = record
        records.move_to_end(record.request_id)
        if len(records) > self.capacity:
            records.popitem(last=False)

    def ended(self, request_id: str, status: int) -> None:
        record = self._records.get(request_id)
        if record is not None and record.status is None:
            record.status = status
            record.ended = time.monotonic()

    def get(self, request_id: str) -> PathRecord | None:
        return self._records.get(request_id)

    async def answer(self, request: web.BaseRequest) -> web.Response:
        """GET /requests?id=REQUEST_ID: where a recent request went (its prefill, decode, room,
        state)."""
        request_id = request.query.get("id", "")
        if not request_id:
            raise ApiError(400, "give the request id: /requests?id=ID", "bad_request", param="id")
        record = self.get(request_id)
        if record is None:
            raise ApiError(
                404,
                f"no recent request {request_id!r} (the last {self.capacity} are kept)",
                "not_found",
            )
        return web.json_response(record.to_json(time.monotonic()))
