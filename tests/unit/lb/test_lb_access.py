"""The access log: one `access {json}` line per PD request, with the path, timings and outcome
that `pdkit trace` reads; none with --no-access-log."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kit.lb.access import BatchedHandler
from tests.support.lb_cluster import run, running_cluster

KEYS = {
    "ts",
    "dp_rank",
    "cached_predicted",
    "cached_pending",
    "cached_actual",
    "prompt_tokens",
    "poison",
    "id",
    "route",
    "status",
    "stream",
    "prefill",
    "decode",
    "bootstrap_room",
    "queued_ms",
    "prefill_ms",
    "decode_ms",
    "ttft_ms",
    "e2e_ms",
    "tokens",
    "cause",
    "admission",
    "retries",
    "migrations",
    "held_ms",
}


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    lines = [r.getMessage() for r in caplog.records if r.name == "kit.lb.access"]
    assert all(line.startswith("access {") for line in lines)
    return [json.loads(line.removeprefix("access ")) for line in lines]


def test_every_pd_request_gets_one_line_with_its_path_and_timings(caplog):
    caplog.set_level(logging.INFO, logger="kit.lb.access")

    async def scenario():
        async with running_cluster(1, 1) as c:
            status, _, headers = await c.post(
                "/generate",
                {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 3}},
                headers={"X-Request-Id": "trace-me-1"},
            )
            assert status == 200
            c.prefill[0].fail_status = 400
            status, _, _ = await c.post("/v1/completions", {"prompt": "x"})
            assert status == 400
            status, _, bad_headers = await c.post("/v1/chat/completions", data=b"{not json")
            assert status == 400
            return headers, bad_headers

    headers, bad_headers = run(scenario())
    stream, failed, bad = access_lines(caplog)
    assert set(stream) == KEYS
    assert stream["id"] == "trace-me-1" and stream["route"] == "/generate"
    assert stream["status"] == 200 and stream["stream"] is True and stream["tokens"] == 3
    assert stream["prefill"] == headers["X-PDKit-Prefill"]
    assert stream["decode"] == headers["X-PDKit-Decode"]
    assert stream["bootstrap_room"] == int(headers["X-PDKit-Bootstrap-Room"])
    assert 0 <= stream["queued_ms"] <= stream["ttft_ms"] <= stream["e2e_ms"]
    assert stream["prefill_ms"] > 0 and stream["decode_ms"] > 0
    assert stream["cause"] == "" and stream["admission"] == "off"
    assert failed["status"] == 400 and failed["cause"] == "prefill_status"
    assert failed["ttft_ms"] is None and failed["tokens"] is None and not failed["stream"]
    assert bad["cause"] == "bad_request" and bad["prefill"] == "" and bad["bootstrap_room"] is None
    assert len(bad["id"]) == 16 and bad["id"] == bad_headers["X-Request-Id"]  # made up


def test_no_access_log_writes_no_line(caplog):
    caplog.set_level(logging.INFO, logger="kit.lb.access")

    async def scenario():
        async with running_cluster(1, 1, args=["--no-access-log"]) as c:
            status, _, _ = await c.post("/generate", {"text": "x"})
            assert status == 200

    run(scenario())
    assert access_lines(caplog) == []


def test_the_batched_handler_writes_whole_lines_when_flushed():
    out = io.StringIO()
    handler = BatchedHandler(out)
    handler.add("access {}")  # no event loop running: written at once
    handler.add('access {"a":1}')
    assert out.getvalue() == 'access {}\naccess {"a":1}\n'
