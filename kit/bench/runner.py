"""Drive one load point: requests at a rate (open loop) or at a fixed concurrency (closed loop),
bounded by a request count and a duration, each request recorded.

Open loop: request i goes out at its arrival time, whether or not earlier ones have answered
(the way users arrive); the client records how late it actually sent it. Closed loop: N users
each send their next request when the previous one ends. The first `warmup` requests run but
are marked, and the metrics leave them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kit.bench.client import PATHS, Client
from kit.bench.machine import LoadMonitor, MachineLoad
from kit.bench.prompts import Api, PromptPlan, prompt_text, request_body
from kit.bench.records import RequestRecord
from kit.perf.workload import Request, WorkloadSpec

PROGRESS_EVERY_S = 0.25


@dataclass(frozen=True)
class LoadSpec:
    """How a point is driven (the workload says what is sent)."""

    api: Api = "chat"
    stream: bool = True
    timeout_s: float = 60.0
    warmup: int = 0
    """The first requests of each point, run but left out of the metrics."""
    duration_s: float | None = None
    """No request goes out later than this (s from the point's start)."""
    concurrency: int | None = None
    """Closed loop: this many users back to back, instead of a rate."""
    prefix_share: float = 0.0
    """Share of each prompt (0..1) that is its group's shared prefix."""
    prefix_groups: int = 0
    cache_details: bool = False
    """Ask for SGLang's `sglext.cached_tokens_details` (return_cached_tokens_details): where
    each answer's cached prompt tokens came from (device, host, storage)."""


@dataclass
class Progress:
    """A point so far: requests sent, answered, within the SLO, failed."""

    total: int
    sent: int = 0
    done: int = 0
    good: int = 0
    failed: int = 0


@dataclass
class PointResult:
    """What one point produced. `wall_s` runs from the first send to the last answer."""

    rate: float | None
    concurrency: int | None
    records: list[RequestRecord]
    started_at: float
    wall_s: float
    load: MachineLoad = field(default_factory=MachineLoad)


def plan_prompt(spec: WorkloadSpec, load: LoadSpec, index: int, request: Request) -> PromptPlan:
    """The prompt plan of request `index`: its group and shared prefix, or its trace blocks."""
    group = None
    prefix = 0
    if load.prefix_groups and load.prefix_share > 0 and not request.hash_ids:
        group = index % load.prefix_groups
        prefix = round(request.prompt_len * load.prefix_share)
    return PromptPlan(
        tokens=request.prompt_len,
        seed=spec.seed,
        index=index,
        group=group,
        prefix=prefix,
        hash_ids=request.hash_ids,
    )


async def run_point(
    client: Client,
    spec: WorkloadSpec,
    rate: float | None,
    load: LoadSpec,
    *,
    run_id: str,
    on_progress: Callable[[Progress], None] | None = None,
    is_good: Callable[[RequestRecord], bool] = lambda r: r.ok,
    watch: dict[str, int] | None = None,
    stop: asyncio.Event | None = None,
) -> PointResult:
    """Serve `spec` at `rate` (requests/s; None with `load.concurrency`) and record every
    request. Prompts are built before the clock starts, so building them costs no send time.
    `watch` names processes of the deployment on this machine (name -> pid) whose CPU use is
    reported with the point. Once `stop` is set no request is sent; those in flight finish and
    the point is what was sent."""
    requests = spec.requests(rate if load.concurrency is None else None)
    model = client.target.model
    bodies = [
        json.dumps(
            request_body(
                load.api,
                model,
                prompt_text(plan_prompt(spec, load, i, r), load.api),
                r.output_len,
                stream=load.stream,
                cache_details=load.cache_details,
            )
        ).encode()
        for i, r in enumerate(requests)
    ]
    records = [
        RequestRecord(
            index=i,
            rate=rate if load.concurrency is None else None,
            warmup=i < load.warmup,
            input_tokens=r.prompt_len,
            output_tokens=r.output_len,
            scheduled_s=r.arrival,
            request_id=f"bench-{run_id}-{i}",
            group=plan_prompt(spec, load, i, r).group,
        )
        for i, r in enumerate(requests)
    ]
    progress = Progress(total=len(records))
    path = PATHS[load.api]
    loop = asyncio.get_running_loop()
    start = loop.time()
    started_at = time.time()

    async def one(record: RequestRecord, body: bytes) -> None:
        record.sent_s = loop.time() - start
        record.send_lag_ms = max(0.0, (record.sent_s - record.scheduled_s) * 1000)
        progress.sent += 1
        await client.send(record, path, body, load.stream)
        progress.done += 1
        if is_good(record):
            progress.good += 1
        elif not record.ok:
            progress.failed += 1

    stopped = stop or asyncio.Event()

    def in_time() -> bool:
        if stopped.is_set():
            return False
        return load.duration_s is None or loop.time() - start < load.duration_s

    async def open_loop() -> list[RequestRecord]:
        tasks = []
        for record, body in zip(records, bodies, strict=True):
            delay = start + record.scheduled_s - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), delay)
            if not in_time():
                break
            tasks.append(asyncio.create_task(one(record, body)))
        await asyncio.gather(*tasks)
        return records[: len(tasks)]

    async def closed_loop(users: int) -> list[RequestRecord]:
        queue = iter(zip(records, bodies, strict=True))
        used: list[RequestRecord] = []

        async def user() -> None:
            for record, body in queue:
                if not in_time():
                    return
                record.scheduled_s = loop.time() - start
                used.append(record)
                await one(record, body)

        await asyncio.gather(*(user() for _ in range(users)))
        return sorted(used, key=lambda r: r.index)

    async def report() -> None:
        while on_progress is not None:
            on_progress(progress)
            await asyncio.sleep(PROGRESS_EVERY_S)

    reporter = asyncio.create_task(report())
    # The prepared requests live as long as the point: keep the collector from walking them
    # again and again while it runs (its pauses would show up as latency).
    gc.collect()
    gc.freeze()
    try:
        async with LoadMonitor(watch) as monitor:
            if load.concurrency is None:
                sent = await open_loop()
            else:
                sent = await closed_loop(load.concurrency)
    finally:
        gc.unfreeze()
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
    if on_progress is not None:
        on_progress(progress)
    first = min((r.sent_s for r in sent), default=0.0)
    last = max((r.sent_s + (r.e2e_ms or 0) / 1000 for r in sent), default=0.0)
    return PointResult(
        rate=rate if load.concurrency is None else None,
        concurrency=load.concurrency,
        records=sent,
        started_at=started_at,
        wall_s=max(last - first, 1e-9),
        load=monitor.load,
    )
