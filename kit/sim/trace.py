"""One log line per step of a PD request, for `pdkit trace` (kit.observe.trace reads them).

SGLang logs a request when it arrives and when it finishes with `--log-requests
--log-requests-format json`: ``{"timestamp": ..., "event": "request.received", "rid": ...,
"obj": {... "bootstrap_room": ...}}`` and ``request.finished`` with ``out.meta_info`` (its
``*_ts`` fields are epoch seconds). The sim writes the same two events, always, and between
them one ``request.stage`` line as each PD stage ends, named as SGLang names the stage in its
request tracing (`RequestStage`):

    prefill  prefill_bootstrap          waited for its decode's KV reservation
             prefill_forward            computed the prompt (from its first scheduled chunk)
             prefill_transfer_kv_cache  wrote the KV into the decode's buffer
    decode   decode_bootstrap           found its prefill (bootstrap server)
             decode_waiting             waited for KV room (prealloc)
             decode_transferred         received the KV (and the first token)

A stage line carries ``start_ts`` and ``end_ts`` (epoch seconds). Health checks and requests
without a bootstrap room write nothing.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

from kit.sim.requests import RequestState

logger = logging.getLogger("kit.sim.trace")


def epoch(monotonic_s: float) -> float:
    """A time.monotonic() reading as epoch seconds."""
    return time.time() - (time.monotonic() - monotonic_s)


def traced(state: RequestState) -> bool:
    return state.inp.bootstrap_room is not None and not state.inp.health_check


def _obj(state: RequestState) -> dict[str, Any]:
    inp = state.inp
    return {
        "rid": inp.rid,
        "bootstrap_host": inp.bootstrap_host,
        "bootstrap_port": inp.bootstrap_port,
        "bootstrap_room": inp.bootstrap_room,
        "stream": inp.stream,
        "input_tokens": inp.prompt_len,
    }


def _log(event: str, data: dict[str, Any], at: float | None = None) -> None:
    """Log one event that happened at `at` (epoch s; default: now)."""
    # `ts` (epoch s) besides SGLang's local-time `timestamp`: hosts may differ in time zone.
    when = time.time() if at is None else at
    line = {
        "timestamp": datetime.fromtimestamp(when).isoformat(),
        "ts": round(when, 6),
        "event": event,
    }
    line.update(data)
    logger.info(json.dumps(line, separators=(",", ":")))


def received(state: RequestState) -> None:
    """The request arrived (SGLang's request.received)."""
    if traced(state):
        _log("request.received", {"rid": state.inp.rid, "obj": _obj(state)}, epoch(state.arrival))


def stage(state: RequestState, name: str, started: float, ended: float | None = None) -> None:
    """A PD stage ended; `started` and `ended` are time.monotonic() readings (ended: now)."""
    if not traced(state):
        return
    end = epoch(ended) if ended is not None else time.time()
    _log(
        "request.stage",
        {
            "rid": state.inp.rid,
            "bootstrap_room": state.inp.bootstrap_room,
            "stage": name,
            "start_ts": round(epoch(started), 6),
            "end_ts": round(end, 6),
        },
    )


def finished(state: RequestState) -> None:
    """The request ended (SGLang's request.finished, with its meta_info times)."""
    if not traced(state):
        return
    meta: dict[str, Any] = {
        "id": state.inp.rid,
        "finish_reason": state.finish.to_json() if state.finish is not None else None,
        "prompt_tokens": state.inp.prompt_len,
        "completion_tokens": len(state.output_ids),
        "request_received_ts": round(epoch(state.arrival), 6),
        "e2e_latency": round(state.e2e_latency(), 6),
    }
    if state.forward_entry_at is not None:
        meta["forward_entry_time"] = round(epoch(state.forward_entry_at), 6)
    if state.first_token_at is not None:
        meta["first_token_latency"] = round(state.first_token_at - state.arrival, 6)
    if state.finished_at is not None:
        meta["request_finished_ts"] = round(epoch(state.finished_at), 6)
    _log(
        "request.finished",
        {"rid": state.inp.rid, "obj": _obj(state), "out": {"meta_info": meta}},
    )
