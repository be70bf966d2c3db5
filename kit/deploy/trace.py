"""`pdkit trace`: find one request in the deployment's logs and lay out its timeline.

The request is named by its id (the router's X-Request-Id, or `request_id` in a `pdkit bench`
requests.jsonl), by its bootstrap room, or by a bench requests.jsonl (its slowest request by
TTFT). The router's access log line gives the prefill, the decode and the room; a request
still in flight has none yet, so pdkit's router is asked (`GET /requests?id=`). Then the
prefill's and the decode's logs are searched for the room (kit.observe.trace parses and
joins the lines).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from kit.errors import PdkitError
from kit.hosts.context import DeployContext
from kit.hosts.logs import matching_lines
from kit.observe.probe import Prober
from kit.observe.report import url_key
from kit.observe.trace import (
    AccessRecord,
    Trace,
    WorkerLine,
    access_from_path,
    build_trace,
    for_request,
    parse_access,
    parse_worker,
)
from kit.topology.plan_types import WorkerProcess


@dataclass(frozen=True)
class Wanted:
    """What to trace: a request id and/or a bootstrap room; `why` says how it was chosen."""

    request_id: str | None
    room: int | None
    why: str = ""


def slowest_in(path: Path) -> Wanted:
    """The request with the longest TTFT (a failed one first) in a bench requests.jsonl."""
    best: tuple[float, dict[str, object]] | None = None
    count = 0
    try:
        text = path.read_text()
    except OSError as exc:
        raise PdkitError(f"cannot read {path}: {exc.strerror}.") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PdkitError(
                f"{path}:{number}: not JSON. To fix: give a requests.jsonl written by pdkit bench."
            ) from exc
        if not isinstance(record, dict) or not record.get("request_id"):
            continue
        count += 1
        ttft = record.get("ttft_ms")
        score = float("inf") if not record.get("ok") else float(ttft or 0.0)
        if best is None or score > best[0]:
            best = (score, record)
    if best is None:
        raise PdkitError(
            f"{path} names no request id. To fix: give a requests.jsonl of `pdkit bench` "
            "against a topology (its records carry request_id)."
        )
    record = best[1]
    room = record.get("bootstrap_room")
    ttft = record.get("ttft_ms")
    what = "failed" if not record.get("ok") else f"TTFT {ttft} ms"
    return Wanted(
        str(record["request_id"]),
        room if isinstance(room, int) else None,
        f"the slowest of {count} requests in {path} ({what})",
    )


def parse_wanted(text: str) -> Wanted:
    """A request id, a bootstrap room (digits), or a bench requests.jsonl."""
    path = Path(text)
    if text.endswith(".jsonl") or path.is_file():
        return slowest_in(path)
    if text.isdigit():
        return Wanted(text, int(text))  # a room, or an id that happens to be digits
    return Wanted(text, None)


def _router_record(ctx: DeployContext, wanted: Wanted) -> AccessRecord | None:
    needles = [n for n in (wanted.request_id, str(wanted.room) if wanted.room else None) if n]
    found = None
    for line in matching_lines(ctx.log_file(ctx.plan.router.name), needles):
        record = parse_access(line)
        if record is None:
            continue
        if record.request_id == wanted.request_id or (
            wanted.room is not None and record.bootstrap_room == wanted.room
        ):
            found = record
    return found


async def _ask_router(ctx: DeployContext, request_id: str) -> AccessRecord | None:
    router = ctx.plan.router
    key = router.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with Prober(timeout=3.0) as prober:
        fetched = await prober.get(f"{router.url}/requests?id={request_id}", headers)
    answer = fetched.json()
    return access_from_path(answer, time.time()) if isinstance(answer, dict) else None


def _process(ctx: DeployContext, url: str | None) -> WorkerProcess | None:
    if url is None:
        return None
    for worker in ctx.plan.workers:
        if worker.serves_http and url_key(worker.url) == url_key(url):
            return worker
    return None


def _lines(ctx: DeployContext, worker: WorkerProcess, wanted: Wanted) -> list[WorkerLine]:
    needles = [str(wanted.room)] if wanted.room is not None else [wanted.request_id or ""]
    parsed = (parse_worker(line) for line in matching_lines(ctx.log_file(worker.name), needles))
    return for_request((p for p in parsed if p is not None), wanted.room, wanted.request_id)


def trace_request(ctx: DeployContext, text: str) -> Trace:
    """The timeline of the request `text` names (see `parse_wanted`)."""
    wanted = parse_wanted(text)
    notes = [f"traced {wanted.why}"] if wanted.why else []
    access = _router_record(ctx, wanted)
    if access is None and wanted.request_id and ctx.plan.router.kind == "pdkit":
        access = asyncio.run(_ask_router(ctx, wanted.request_id))
        if access is not None and access.in_flight:
            notes.append("the router has not answered it yet (from its GET /requests)")
    if access is None and wanted.room is None:
        raise PdkitError(
            f"no request {text!r} in the router's log or its recent requests. To fix: give "
            "the id from the X-Request-Id header or a bench requests.jsonl, or a bootstrap room."
        )
    if access is not None and access.bootstrap_room is not None:
        wanted = Wanted(access.request_id, access.bootstrap_room, wanted.why)
    prefill, decode = (
        (_process(ctx, access.prefill), _process(ctx, access.decode)) if access else (None, None)
    )
    if access is None:
        notes.append("the router logged no access line for it: its workers found by the room")
    parts: dict[str, tuple[str, list[WorkerLine]]] = {}
    candidates = [w for w in (prefill, decode) if w is not None] or [
        w for w in ctx.plan.workers if w.serves_http
    ]
    for worker in candidates:
        lines = _lines(ctx, worker, wanted)
        if lines or worker in (prefill, decode):
            parts.setdefault(worker.role, (worker.instance_name, lines))
    if access is None and not parts:
        raise PdkitError(
            f"no worker logged bootstrap room {wanted.room}. To fix: check the number (the "
            "X-PDKit-Bootstrap-Room header), or the request is older than the current logs."
        )
    if ctx.plan.engine == "sglang" and not any(lines for _, lines in parts.values()):
        notes.append(
            "SGLang logs requests only with --log-requests --log-requests-format json "
            "(set them in the topology's args)"
        )
    return build_trace(access, parts.get("prefill"), parts.get("decode"), notes)
