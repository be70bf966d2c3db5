"""A request answered 200 with no generated token is a failed request in `pdkit bench`, never
an answer or goodput (a benchmark that "succeeds" with 0 tokens, #37 row 20)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from kit.bench.client import Client, Target
from kit.bench.machine import MachineLoad
from kit.bench.metrics import summarize
from kit.bench.records import RequestRecord
from kit.bench.runner import PointResult
from kit.topology.schema import SLO

SLO_ = SLO(ttft_ms=400, tpot_ms=40, attainment=0.9)


def point(records: list[RequestRecord]) -> PointResult:
    return PointResult(2.0, None, records, 0.0, 10.0, MachineLoad(client_cpu=0.1, host_cpu=0.2))


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        usage = {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8}
        return web.json_response({"choices": [{"text": ""}], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    usage = {"prompt_tokens": 8, "completion_tokens": 0}
    await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


def test_requests_that_produce_no_tokens_fail_and_count_no_goodput():
    async def go() -> list[RequestRecord]:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        async with TestServer(app) as server:
            target = Target(url=str(server.make_url("")).rstrip("/"), model="m")
            records = []
            async with Client(target, timeout=5) as client:
                for i, stream in enumerate((False, True, False, True)):
                    r = RequestRecord(
                        index=i, rate=2.0, warmup=False, input_tokens=8, output_tokens=4
                    )
                    r.sent_s = i * 0.5
                    body = json.dumps({"model": "m", "prompt": "x", "stream": stream}).encode()
                    await client.send(r, "/v1/completions", body, stream)
                    records.append(r)
            return records

    records = asyncio.run(go())
    assert [(r.ok, r.error_kind) for r in records] == [(False, "empty")] * 4
    assert records[0].error == "the server answered 200 with no generated token"
    summary = summarize(point(records), SLO_)
    assert (summary.ok, summary.good, summary.goodput) == (0, 0, 0.0)
    assert summary.errors == {"empty": 4}
    assert any("4 of 4 requests produced no tokens" in note for note in summary.notes)
