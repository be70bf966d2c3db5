"""One request across the router, its prefill and its decode, as one timeline. Pure: lines in,
a `Trace` out (`kit.deploy.trace` reads the logs).

The router's access log line (pdkit's router, one per PD request; keys of `AccessRecord`)
names the request id, the prefill and decode it chose and the bootstrap room, which both
workers log the request under:

    sim     request.received, one request.stage line per PD stage as it ends, and
            request.finished (kit/sim/trace.py)
    sglang  request.received and request.finished with `--log-requests --log-requests-format
            json`; the finished line's meta_info gives the arrival, the forward entry, the end of
            the prefill, the first token and the end (SGLang logs no KV transfer times)

Times are epoch seconds from each host's clock; the timeline is in milliseconds from the
request's arrival at the router (or at the first worker that logged it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

WORKER_EVENTS = ("request.received", "request.stage", "request.finished")
ACCESS_MARK = "access {"

STAGES = {
    "prefill_bootstrap": "bootstrap: waited for its decode's KV reservation",
    "prefill_forward": "prefill: computed the prompt",
    "prefill_transfer_kv_cache": "KV transfer: wrote the KV into the decode",
    "decode_bootstrap": "bootstrap: found its prefill",
    "decode_waiting": "prealloc: waited for KV room",
    "decode_transferred": "KV transfer: received the KV",
}
"""SGLang's PD stage names (RequestStage) and what each means in the timeline."""
ROLE_STAGES = {
    "prefill": ("received", "prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache"),
    "decode": ("received", "decode_bootstrap", "decode_waiting", "decode_transferred"),
}
"""The order a role logs a request in, before `finished`."""


@dataclass(frozen=True)
class AccessRecord:
    """The router's view of one request: times in ms from its arrival (`arrived`, epoch s),
    worker URLs as the router knows them. `in_flight` when it has not ended yet."""

    request_id: str
    route: str = ""
    status: int | None = None
    stream: bool | None = None
    prefill: str | None = None
    decode: str | None = None
    bootstrap_room: int | None = None
    arrived: float | None = None
    queued_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tokens: int | None = None
    cause: str | None = None
    admission: str | None = None
    retries: int = 0
    migrations: int = 0
    held_ms: float | None = None
    dp_rank: int | None = None
    cached_predicted: int | None = None
    cached_pending: int | None = None
    cached_actual: int | None = None
    poison: str | None = None
    """The body's fingerprint when a prefill died under it or the poison rule refused it."""
    in_flight: bool = False
    age_ms: float | None = None
    """In flight: how long it had been running when the router was asked."""


@dataclass(frozen=True)
class WorkerLine:
    """One per-request line of a worker's log. `start`/`end` are epoch seconds (a stage's
    span; a point event has `end` None)."""

    event: Literal["received", "stage", "finished"]
    rid: str
    room: int | None
    start: float | None
    end: float | None = None
    stage: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One row of the timeline: `start`/`end` in ms from the arrival (`end` None: a point)."""

    start: float
    end: float | None
    process: str
    what: str


@dataclass(frozen=True)
class Trace:
    request_id: str | None
    room: int | None
    prefill: str | None
    decode: str | None
    access: AccessRecord | None
    steps: tuple[Step, ...]
    phases: tuple[tuple[str, float], ...]
    stopped: tuple[str, ...]
    notes: tuple[str, ...]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: object) -> int | None:
    """An integer as JSON gave it (bootstrap rooms are 64-bit: never through a float)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _epoch(value: object) -> float | None:
    """Epoch seconds from a number or an ISO 8601 time (a naive one is taken as local time)."""
    number = _number(value)
    if number is not None:
        return number
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _json_after(line: str, start: int) -> dict[str, Any] | None:
    try:
        data = json.loads(line[start:])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _url(value: object) -> str | None:
    """A worker URL ("" when the router chose none)."""
    return value if isinstance(value, str) and value else None


def parse_access(line: str) -> AccessRecord | None:
    """The router's `access {json}` line, or None for any other line."""
    at = line.find(ACCESS_MARK)
    data = _json_after(line, at + len(ACCESS_MARK) - 1) if at >= 0 else None
    if data is None or not isinstance(data.get("id"), str):
        return None
    stream = data.get("stream")
    return AccessRecord(
        request_id=data["id"],
        route=str(data.get("route") or ""),
        status=_int(data.get("status")),
        stream=stream if isinstance(stream, bool) else None,
        prefill=_url(data.get("prefill")),
        decode=_url(data.get("decode")),
        bootstrap_room=_int(data.get("bootstrap_room")),
        arrived=_epoch(data.get("ts")),
        queued_ms=_number(data.get("queued_ms")),
        prefill_ms=_number(data.get("prefill_ms")),
        decode_ms=_number(data.get("decode_ms")),
        ttft_ms=_number(data.get("ttft_ms")),
        e2e_ms=_number(data.get("e2e_ms")),
        tokens=_int(data.get("tokens")),
        cause=str(data["cause"]) if data.get("cause") else None,
        admission=str(data["admission"]) if data.get("admission") else None,
        retries=_int(data.get("retries")) or 0,
        migrations=_int(data.get("migrations")) or 0,
        held_ms=_number(data.get("held_ms")) or None,
        dp_rank=_int(data.get("dp_rank")),
        cached_predicted=_int(data.get("cached_predicted")),
        cached_pending=_int(data.get("cached_pending")),
        cached_actual=_int(data.get("cached_actual")),
        poison=str(data["poison"]) if data.get("poison") else None,
    )


def access_from_path(answer: dict[str, Any], now: float) -> AccessRecord | None:
    """An in-flight request as pdkit's router answers `GET /requests?id=` (`now`: epoch s;
    `seconds` is how long it has been running)."""
    if not isinstance(answer.get("id"), str):
        return None
    seconds = _number(answer.get("seconds"))
    in_flight = answer.get("state") == "in_flight"
    return AccessRecord(
        request_id=answer["id"],
        route=str(answer.get("route") or ""),
        status=_int(answer.get("status")),
        prefill=_url(answer.get("prefill")),
        decode=_url(answer.get("decode")),
        bootstrap_room=_int(answer.get("bootstrap_room")),
        # `seconds` is its age while in flight, its duration once done.
        arrived=now - seconds if seconds is not None and in_flight else None,
        in_flight=in_flight,
        age_ms=seconds * 1000 if seconds is not None and in_flight else None,
    )


def _room(data: dict[str, Any]) -> int | None:
    room = _int(data.get("bootstrap_room"))
    obj = data.get("obj")
    if room is None and isinstance(obj, dict):
        room = _int(obj.get("bootstrap_room"))
    return room


def parse_worker(line: str) -> WorkerLine | None:
    """A worker's per-request JSON line (the sim's, or SGLang's `--log-requests-format json`)."""
    at = line.find('{"')
    data = _json_after(line, at) if at >= 0 else None
    if data is None or data.get("event") not in WORKER_EVENTS:
        return None
    event = str(data["event"]).removeprefix("request.")
    rid = str(data.get("rid") or "")
    when = _epoch(data.get("ts")) or _epoch(data.get("timestamp"))
    if event == "stage":
        return WorkerLine(
            "stage",
            rid,
            _room(data),
            _epoch(data.get("start_ts")),
            _epoch(data.get("end_ts")) or when,
            stage=str(data.get("stage") or ""),
        )
    if event == "finished":
        out = data.get("out")
        meta = out.get("meta_info") if isinstance(out, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        # SGLang's timestamp is local time; its meta_info times are epoch seconds.
        ended = _number(meta.get("request_finished_ts"))
        return WorkerLine("finished", rid, _room(data), ended or when, meta=meta)
    return WorkerLine("received", rid, _room(data), when)


def for_request(lines: Iterable[WorkerLine], room: int | None, rid: str | None) -> list[WorkerLine]:
    """The lines of one request: its bootstrap room, else its request id."""
    return [
        line
        for line in lines
        if (room is not None and line.room == room) or (rid and line.rid == rid and room is None)
    ]


def _ms(epoch_s: float | None, origin: float) -> float | None:
    return None if epoch_s is None else (epoch_s - origin) * 1000


def _router_steps(access: AccessRecord, origin: float, prefill: str, decode: str) -> list[Step]:
    if access.arrived is None:
        return []
    start = _ms(access.arrived, origin) or 0.0
    what = f"received {access.route}".rstrip()
    steps = [Step(start, None, "router", what)]
    dispatched = start + (access.queued_ms or 0.0)
    if access.queued_ms:
        admission = f" (admission {access.admission})" if access.admission else ""
        steps.append(Step(start, dispatched, "router", f"dispatch{admission}"))
    if access.held_ms:
        steps.append(
            Step(start, start + access.held_ms, "router", "held: no routable worker of a role")
        )
    if access.retries:
        again = "once" if access.retries == 1 else f"{access.retries} times"
        steps.append(
            Step(start, dispatched, "router", f"sent again on a fresh pair {again} (a leg failed)")
        )
    if access.poison:
        why = {
            "poison_refused": "refused: prefills died twice under this same request",
            "poison_suspect": "not sent elsewhere: its prefill died under it and was not back",
        }.get(access.cause or "", "a prefill died under it: sent again only to that prefill")
        steps.append(
            Step(start, None, "router", f"poison rule (fingerprint {access.poison}): {why}")
        )
    if access.in_flight and access.age_ms is not None:
        steps.append(Step(start, start + access.age_ms, "router", "waiting for the answer"))
    if access.prefill_ms is not None:
        steps.append(
            Step(dispatched, dispatched + access.prefill_ms, "router", f"prefill leg ({prefill})")
        )
    if access.cached_predicted is not None or access.cached_actual is not None:
        rank = f" rank {access.dp_rank}" if access.dp_rank is not None else ""
        predicted = "?" if access.cached_predicted is None else str(access.cached_predicted)
        if access.cached_pending:
            predicted += f" ({access.cached_pending} pending)"
        actual = "?" if access.cached_actual is None else str(access.cached_actual)
        steps.append(
            Step(
                dispatched,
                None,
                "router",
                f"cached tokens on the prefill{rank}: predicted {predicted}, actual {actual}",
            )
        )
    if access.decode_ms is not None:
        steps.append(
            Step(dispatched, dispatched + access.decode_ms, "router", f"decode leg ({decode})")
        )
    if access.ttft_ms is not None:
        steps.append(Step(start + access.ttft_ms, None, "router", "first token to the client"))
    if access.e2e_ms is not None:
        ended = f"answered {access.status}" if access.status is not None else "ended"
        tokens = f", {access.tokens} tokens" if access.tokens is not None else ""
        cause = f" ({access.cause})" if access.cause else ""
        moved = ""
        if access.migrations:
            moved = f", stream migrated {access.migrations}x (legs shown: the last pair)"
        steps.append(Step(start + access.e2e_ms, None, "router", f"{ended}{tokens}{cause}{moved}"))
    return steps


def _worker_steps(lines: Sequence[WorkerLine], process: str, origin: float) -> list[Step]:
    steps: list[Step] = []
    staged = {line.stage for line in lines if line.event == "stage"}
    for line in lines:
        start = _ms(line.start, origin)
        if line.event == "received" and start is not None:
            steps.append(Step(start, None, process, "received"))
        elif line.event == "stage" and start is not None:
            what = STAGES.get(line.stage, line.stage)
            steps.append(Step(start, _ms(line.end, origin), process, what))
        elif line.event == "finished":
            steps += _finished_steps(line.meta, process, origin, staged)
    return steps


def _finished_steps(
    meta: dict[str, Any], process: str, origin: float, staged: set[str]
) -> list[Step]:
    """What a finished line's meta_info adds: SGLang's forward entry and end of prefill (when
    no stage line said it), the first token, the decoding and the end."""
    steps: list[Step] = []
    received = _number(meta.get("request_received_ts"))
    forward = _ms(_number(meta.get("forward_entry_time")), origin)
    prefilled = _ms(_number(meta.get("prefill_finished_time")), origin)
    if forward is not None and "prefill_forward" not in staged:
        steps.append(Step(forward, prefilled, process, "prefill: computed the prompt"))
    latency = _number(meta.get("first_token_latency"))
    first = _ms(received + latency, origin) if received is not None and latency else None
    finished = _ms(_number(meta.get("request_finished_ts")), origin)
    if finished is None and received is not None:
        e2e = _number(meta.get("e2e_latency"))
        finished = _ms(received + e2e, origin) if e2e is not None else None
    tokens = _int(meta.get("completion_tokens"))
    if first is not None and process.startswith("decode"):
        steps.append(Step(first, None, process, "first token"))
        if finished is not None and tokens and tokens > 1:
            steps.append(Step(first, finished, process, f"decode: {tokens - 1} more tokens"))
    if finished is not None:
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else None
        status = f" ({kind})" if kind else ""
        steps.append(Step(finished, None, process, f"finished{status}"))
    return steps


def _stopped(role: str, process: str, lines: Sequence[WorkerLine]) -> str | None:
    """Where a worker's part of the request stopped, None when it finished normally."""
    finished = next((line for line in lines if line.event == "finished"), None)
    reason = finished.meta.get("finish_reason") if finished is not None else None
    aborted = isinstance(reason, dict) and reason.get("type") == "abort"
    if finished is not None and not aborted:
        return None
    order = ROLE_STAGES[role]
    done = {"received" if line.event == "received" else line.stage for line in lines}
    done.discard("")
    if not done & set(order):
        return f"{process} logged nothing for this request (it never arrived, or hangs before)"
    reached = max(order.index(s) for s in done if s in order)
    how = "was aborted" if aborted else "stopped"
    if aborted and isinstance(reason, dict) and reason.get("message"):
        how += f" ({reason['message']})"
    if reached + 1 < len(order):
        following = order[reached + 1]
        return f"{process} {how} before {following} ({STAGES[following]})"
    return f"{process} {how} after {order[reached]}, before it finished"


def _first(steps: Sequence[Step], what: str) -> Step | None:
    return next((s for s in steps if s.what == what), None)


def _phases(steps: Sequence[Step], access: AccessRecord | None) -> list[tuple[str, float]]:
    """The request's phases in ms: dispatch (admission, choosing workers), bootstrap, the
    prefill's scheduler queue, prefill, KV transfer, the first token (from the arrival),
    decoding, total."""

    def took(what: str) -> float | None:
        step = _first(steps, what)
        return step.end - step.start if step is not None and step.end is not None else None

    bootstrap = _first(steps, STAGES["prefill_bootstrap"])
    forward = _first(steps, STAGES["prefill_forward"])
    queue = None
    if bootstrap is not None and bootstrap.end is not None and forward is not None:
        queue = max(0.0, forward.start - bootstrap.end)
    first_token = access.ttft_ms if access is not None else None
    if first_token is None:
        first_token = next((s.start for s in steps if s.what == "first token"), None)
    decoding = next((s for s in steps if s.what.startswith("decode: ")), None)
    phases = (
        ("dispatch", access.queued_ms if access is not None else None),
        ("bootstrap", took(STAGES["prefill_bootstrap"])),
        ("prefill queue", queue),
        ("prefill", took(STAGES["prefill_forward"])),
        ("KV transfer", took(STAGES["prefill_transfer_kv_cache"])),
        ("first token at", first_token),
        ("decode", decoding.end - decoding.start if decoding and decoding.end else None),
        ("total", access.e2e_ms if access is not None else None),
    )
    return [(name, ms) for name, ms in phases if ms is not None]


def build_trace(
    access: AccessRecord | None,
    prefill: tuple[str, Sequence[WorkerLine]] | None,
    decode: tuple[str, Sequence[WorkerLine]] | None,
    notes: Sequence[str] = (),
) -> Trace:
    """The timeline of one request from the router's record and each worker's lines (process
    name, its lines for this request)."""
    worker_lines = [line for part in (prefill, decode) if part for line in part[1]]
    starts = [line.start for line in worker_lines if line.start is not None]
    starts += [
        t
        for line in worker_lines
        if (t := _number(line.meta.get("request_received_ts"))) is not None
    ]
    origin = min(starts, default=0.0)
    if access is not None and access.arrived is not None:
        # An in-flight request's arrival is its age subtracted from now: never after a worker's.
        origin = min(access.arrived, origin) if access.in_flight and starts else access.arrived
    prefill_name = prefill[0] if prefill else (access.prefill if access else None)
    decode_name = decode[0] if decode else (access.decode if access else None)
    steps: list[Step] = []
    if access is not None:
        steps += _router_steps(access, origin, prefill_name or "?", decode_name or "?")
    stopped: list[str] = []
    for role, part in (("prefill", prefill), ("decode", decode)):
        if part is None:
            continue
        process, lines = part
        steps += _worker_steps(lines, process, origin)
        why = _stopped(role, process, lines)
        if why is not None:
            stopped.append(why)
    steps.sort(key=lambda s: (s.start, s.end is not None, s.end or 0.0))
    rooms = [line.room for line in worker_lines if line.room is not None]
    return Trace(
        request_id=access.request_id if access else next((w.rid for w in worker_lines), None),
        room=access.bootstrap_room
        if access and access.bootstrap_room is not None
        else (rooms[0] if rooms else None),
        prefill=prefill_name,
        decode=decode_name,
        access=access,
        steps=tuple(steps),
        phases=tuple(_phases(steps, access)),
        stopped=tuple(stopped),
        notes=tuple(notes),
    )


def _fmt(ms: float | None) -> str:
    return "" if ms is None else f"{ms:,.1f}"


def gaps(steps: Sequence[Step]) -> list[float | None]:
    """Per step, the time (ms) its process logged nothing before it: since that process's
    previous step ended, or, for a worker's first step, since the router received the request
    (the dispatch). None where there is no earlier step to measure from."""
    last: dict[str, float] = {}
    arrival = next((s.start for s in steps if s.process == "router"), None)
    found: list[float | None] = []
    for step in steps:
        before = last.get(step.process, arrival if step.process != "router" else None)
        found.append(step.start - before if before is not None else None)
        end = step.end if step.end is not None else step.start
        last[step.process] = max(last.get(step.process, end), end)
    return found


def trace_lines(trace: Trace) -> list[str]:
    """The timeline as text: a head, one row per step (start, duration and the gap its process
    logged nothing in before it, all ms), the phases, and where it stopped."""
    access = trace.access
    room = trace.room if trace.room is not None else "?"
    head = f"request {trace.request_id or '?'}  room {room}"
    if access is not None:
        state = "in flight" if access.in_flight else f"status {access.status}"
        head += f"  {access.route}  {state}"
    lines = [head, f"  prefill {trace.prefill or '?'} -> decode {trace.decode or '?'}", ""]
    lines.append(f"{'at ms':>10} {'took ms':>9} {'gap ms':>8}  {'process':<11} step")
    for step, gap in zip(trace.steps, gaps(trace.steps), strict=True):
        took = step.end - step.start if step.end is not None else None
        shown_gap = _fmt(gap) if gap is not None and gap >= 0.05 else ""
        lines.append(
            f"{_fmt(step.start):>10} {_fmt(took):>9} {shown_gap:>8}  {step.process:<11} {step.what}"
        )
    if trace.phases:
        lines.append("")
        lines.append("phases: " + " | ".join(f"{name} {ms:,.1f} ms" for name, ms in trace.phases))
    for why in trace.stopped:
        lines.append(f"stopped: {why}")
    lines += [f"note: {note}" for note in trace.notes]
    return lines
