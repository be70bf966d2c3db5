"""`pdkit trace`'s timeline from the lines the router and the workers really write: the sim's
(kit.sim.trace, captured from its logger), SGLang's `--log-requests-format json` and the
router's access line."""

from __future__ import annotations

import json
import logging
import time

import pytest

from kit.observe.trace import (
    access_from_path,
    build_trace,
    for_request,
    parse_access,
    parse_worker,
    trace_lines,
)
from kit.perf.scheduler import FinishReason
from kit.sim import trace as sim_trace
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.tokens import OutputSource

ROOM = 7540267926668652956  # 64-bit: a float would lose its last digits
T0 = round(time.time(), 3)  # as the access line writes it


def access_line(**changes: object) -> str:
    """An access line as pdkit's router writes it (kit/lb/access.py), at T0."""
    data = {
        "ts": round(T0, 3),
        "id": "bench-1-p0-4",
        "route": "/v1/chat/completions",
        "status": 200,
        "stream": True,
        "prefill": "http://127.0.0.1:30000",
        "decode": "http://127.0.0.1:30100",
        "bootstrap_room": ROOM,
        "queued_ms": 0.4,
        "prefill_ms": 20.0,
        "decode_ms": 140.0,
        "ttft_ms": 25.0,
        "e2e_ms": 141.0,
        "tokens": 16,
        "cause": "",
        "admission": "off",
    }
    data.update(changes)
    return "access " + json.dumps(data, separators=(",", ":"))


def state(rid: str, mode: str) -> RequestState:
    inp = GenerateInput(rid, [1, 2, 3], 16, bootstrap_room=ROOM, bootstrap_host="127.0.0.1")
    return RequestState(inp, OutputSource(0, inp.prompt_ids), None)


def at(ms: float) -> float:
    """The time.monotonic() reading `ms` after T0."""
    return time.monotonic() - (time.time() - T0) + ms / 1000


@pytest.fixture
def sim_lines(caplog):
    """What a prefill and a decode sim log for one request (their `kit.sim.trace` lines)."""
    caplog.set_level(logging.INFO, logger="kit.sim.trace")

    def logged(write) -> list[str]:
        caplog.clear()
        write()
        return [r.getMessage() for r in caplog.records]

    def prefill() -> None:
        s = state("p-rid", "prefill")
        s.arrival = at(1.0)
        sim_trace.received(s)
        sim_trace.stage(s, "prefill_bootstrap", at(1.0), at(3.0))
        sim_trace.stage(s, "prefill_forward", at(3.5), at(11.5))
        sim_trace.stage(s, "prefill_transfer_kv_cache", at(11.5), at(17.5))
        s.first_token_at, s.finished_at = at(17.6), at(17.6)
        s.output_ids = [5]
        s.finish = FinishReason("length", length=0)
        sim_trace.finished(s)

    def decode() -> None:
        s = state("d-rid", "decode")
        s.arrival = at(1.2)
        sim_trace.received(s)
        sim_trace.stage(s, "decode_bootstrap", at(1.3), at(1.5))
        sim_trace.stage(s, "decode_waiting", at(1.5), at(1.7))
        sim_trace.stage(s, "decode_transferred", at(1.8), at(18.0))
        s.first_token_at, s.finished_at = at(19.0), at(140.0)
        s.output_ids = list(range(16))
        s.finish = FinishReason("length", length=16)
        sim_trace.finished(s)

    return logged(prefill), logged(decode)


def parsed(lines: list[str]) -> list:
    return for_request([p for p in map(parse_worker, lines) if p is not None], ROOM, None)


def test_a_finished_request_shows_each_phase_and_the_gaps(sim_lines):
    prefill, decode = sim_lines
    access = parse_access(f"2026-11-30 20:00:00,000 INFO kit.lb.access: {access_line()}")
    assert access is not None and access.bootstrap_room == ROOM
    trace = build_trace(access, ("prefill-0", parsed(prefill)), ("decode-0", parsed(decode)))
    whats = [(s.process, s.what) for s in trace.steps]
    assert whats[0] == ("router", "received /v1/chat/completions")
    assert ("prefill-0", "prefill: computed the prompt") in whats
    assert ("decode-0", "KV transfer: received the KV") in whats
    assert whats[-1] == ("decode-0", "finished (length)") or whats[-1][0] == "router"
    starts = [s.start for s in trace.steps]
    assert starts == sorted(starts)
    phases = dict(trace.phases)
    assert phases["bootstrap"] == pytest.approx(2.0, abs=0.05)
    assert phases["prefill queue"] == pytest.approx(0.5, abs=0.05)
    assert phases["prefill"] == pytest.approx(8.0, abs=0.05)
    assert phases["KV transfer"] == pytest.approx(6.0, abs=0.05)
    assert phases["first token at"] == 25.0 and phases["total"] == 141.0
    assert phases["decode"] == pytest.approx(121.0, abs=0.05)
    assert not trace.stopped
    text = "\n".join(trace_lines(trace))
    assert f"request bench-1-p0-4  room {ROOM}" in text
    assert "prefill prefill-0 -> decode decode-0" in text
    # the prefill's scheduler queue is a gap: it logged nothing between bootstrap and forward
    (row,) = [line for line in trace_lines(trace) if "computed the prompt" in line]
    assert row.split()[:4] == ["3.5", "8.0", "0.5", "prefill-0"]
    # a worker's first line: its gap is the dispatch from the router's arrival
    (row,) = [line for line in trace_lines(trace) if "decode-0    received" in line]
    assert row.split()[:3] == ["1.2", "1.2", "decode-0"]


def test_a_request_stuck_on_a_hung_decode_shows_where_it_stopped(sim_lines):
    prefill, _ = sim_lines
    # The router has not answered it: its GET /requests says where it went.
    access = access_from_path(
        {
            "id": "hung-1",
            "route": "/generate",
            "prefill": "http://127.0.0.1:30000",
            "decode": "http://127.0.0.1:30100",
            "bootstrap_room": ROOM,
            "state": "in_flight",
            "status": None,
            "seconds": 4.2,
        },
        T0 + 4.2,
    )
    assert access is not None and access.in_flight
    waiting = parsed(prefill[:1])  # received, then nothing: no decode ever reserved
    trace = build_trace(access, ("prefill-0", waiting), ("decode-0", []))
    assert trace.stopped == (
        "prefill-0 stopped before prefill_bootstrap (bootstrap: waited for its decode's KV "
        "reservation)",
        "decode-0 logged nothing for this request (it never arrived, or hangs before)",
    )
    text = "\n".join(trace_lines(trace))
    assert "in flight" in text and "stopped: decode-0 logged nothing" in text


def test_sglang_log_requests_lines_give_the_prefill_the_first_token_and_the_end():
    meta = {
        "id": "r1",
        "finish_reason": {"type": "length", "length": 8},
        "completion_tokens": 8,
        "request_received_ts": T0 + 0.001,
        "forward_entry_time": T0 + 0.004,
        "prefill_finished_time": T0 + 0.012,
        "first_token_latency": 0.02,
        "request_finished_ts": T0 + 0.1,
        "e2e_latency": 0.099,
    }
    line = "[2026-11-30 20:00:00 TP0] " + json.dumps(
        {
            "timestamp": "2026-11-30T20:00:00.000001",
            "event": "request.finished",
            "rid": "r1",
            "obj": {"rid": "r1", "bootstrap_room": ROOM},
            "out": {"meta_info": meta},
        }
    )
    lines = parsed([line, "[2026-11-30 20:00:00] Decode batch. #running-req: 1"])
    trace = build_trace(None, None, ("decode-0", lines))
    whats = {s.what: s for s in trace.steps}
    forward = whats["prefill: computed the prompt"]
    # from the arrival it logged (request_received_ts, 1 ms after T0)
    assert (forward.start, forward.end) == pytest.approx((3.0, 11.0), abs=0.01)
    assert whats["first token"].start == pytest.approx(20.0, abs=0.01)
    assert whats["finished (length)"].start == pytest.approx(99.0, abs=0.01)
    assert not trace.stopped


def test_lines_of_other_requests_and_other_formats_are_not_taken():
    other = access_line(id="x")
    assert parse_access("INFO kit.lb: decode worker http://h:1 is healthy") is None
    assert parse_worker("[t] INFO kit.sim.engine: Prefill batch. #new-seq: 1") is None
    assert parse_worker('[t] {"event": "something.else"}') is None
    assert parse_access(other) is not None
    assert parse_access(access_line(prefill="")).prefill is None  # none chosen


def test_the_routers_own_access_line_is_read_back(caplog):
    from kit.lb.access import AccessLog  # noqa: PLC0415
    from kit.lb.exchange import Exchange  # noqa: PLC0415
    from kit.lb.protocol import parse_request  # noqa: PLC0415
    from kit.lb.recent import PathRecord  # noqa: PLC0415

    caplog.set_level(logging.INFO, logger="kit.lb.access")
    started = 100.0
    ex = Exchange(
        request=None,  # type: ignore[arg-type]  # the access line reads no request field
        pd=parse_request("/generate", b'{"text": "hi"}'),
        started=started,
        request_id="r-9",
        path=PathRecord("r-9", "/generate", "http://[fd00::1]:30000", "", ROOM, started),
        sent_at=started + 0.002,
        prefill_s=0.5,
        cause="decode_unavailable",
    )
    AccessLog(enabled=True).exchange(ex, 503, 0.75)
    (record,) = caplog.records
    access = parse_access(f"2026-11-30 20:00:00 INFO kit.lb.access: {record.getMessage()}")
    assert access is not None
    assert (access.request_id, access.status, access.bootstrap_room) == ("r-9", 503, ROOM)
    assert (access.prefill, access.decode) == ("http://[fd00::1]:30000", None)
    assert (access.queued_ms, access.prefill_ms, access.e2e_ms) == (2.0, 500.0, 750.0)
    assert access.cause == "decode_unavailable" and access.arrived is not None


def test_retries_holds_and_migrations_show_in_the_routers_steps():
    line = access_line(retries=1, migrations=2, held_ms=800.0, queued_ms=900.0)
    access = parse_access(line)
    assert access is not None
    assert (access.retries, access.migrations, access.held_ms) == (1, 2, 800.0)
    trace = build_trace(access, None, None)
    whats = [s.what for s in trace.steps if s.process == "router"]
    assert "held: no routable worker of a role" in whats
    assert "sent again on a fresh pair once (a leg failed)" in whats
    assert any("stream migrated 2x" in w for w in whats)
    old = parse_access(access_line())  # a line from a router without these keys
    assert old is not None and (old.retries, old.migrations, old.held_ms) == (0, 0, None)


def test_the_poison_rule_is_named_in_the_routers_steps():
    line = access_line(status=502, cause="poison_refused", poison="0123456789abcdef")
    access = parse_access(line)
    assert access is not None and access.poison == "0123456789abcdef"
    whats = [s.what for s in build_trace(access, None, None).steps if s.process == "router"]
    assert any("poison rule (fingerprint 0123456789abcdef): refused" in w for w in whats)
    assert parse_access(access_line(poison="")).poison is None
