"""A point's numbers, the goodput search, and which worker failures point at."""

from __future__ import annotations

import asyncio

import pytest

from kit.bench.machine import MachineLoad, verdict
from kit.bench.metrics import summarize, suspects
from kit.bench.records import RequestRecord
from kit.bench.run import short_points
from kit.bench.runner import PointResult
from kit.bench.search import SearchResult, SearchSpec, search_goodput
from kit.perf.workload import WorkloadSpec
from kit.topology.schema import SLO

SLO_ = SLO(ttft_ms=400, tpot_ms=40, attainment=0.9)


def record(i, *, ttft=100.0, tpot=20.0, ok=True, warmup=False, prefill="p0", decode="d0", **kw):
    r = RequestRecord(index=i, rate=2.0, warmup=warmup, input_tokens=512, output_tokens=64)
    r.sent_s = i * 0.5
    r.ok, r.ttft_ms, r.tpot_ms = ok, (ttft if ok else None), (tpot if ok else None)
    r.e2e_ms = (ttft + 63 * tpot) if ok else 3000.0
    r.completion_tokens = 64 if ok else 0
    r.prefill, r.decode = prefill, decode
    if not ok:
        r.error_kind, r.error = "timeout", "no complete answer within 3 s"
    for key, value in kw.items():
        setattr(r, key, value)
    return r


def point(records):
    return PointResult(2.0, None, records, 0.0, 10.0, MachineLoad(client_cpu=0.1, host_cpu=0.2))


def test_attainment_counts_errors_as_misses_and_leaves_the_warmup_out():
    records = [record(0, warmup=True, ttft=9999)]
    records += [record(i) for i in range(1, 8)]
    records += [record(8, ttft=500), record(9, tpot=41), record(10, ok=False)]
    s = summarize(point(records), SLO_)
    assert s.requests == 10 and s.ok == 9 and s.good == 7
    assert s.attainment == pytest.approx(0.7)
    assert s.errors == {"timeout": 1}
    assert "no complete answer" in s.error_examples["timeout"]
    assert s.ttft_ms.p50 == pytest.approx(100.0)
    assert s.sent_rate == pytest.approx(2.0)  # one request every 0.5 s
    assert s.goodput == pytest.approx(0.7 * 2.0) and s.throughput == pytest.approx(0.9 * 2.0)


def test_requests_refused_with_429_miss_and_the_admitted_attainment_leaves_them_out():
    records = [record(i) for i in range(6)]
    records += [record(i, ok=False, status=429, error_kind="http") for i in range(6, 10)]
    s = summarize(point(records), SLO_)
    assert s.rejected == 4 and s.attainment == pytest.approx(0.6)
    assert s.admitted_attainment == pytest.approx(1.0)
    assert s.to_json()["rejected"] == 4
    assert any("4 of 10 requests refused with 429" in note for note in s.notes)


def test_the_decode_all_failures_share_is_named_not_the_prefills_it_shared():
    records = [record(i, ok=False, prefill=f"p{i % 2}", decode="d0") for i in range(8)]
    records += [record(8 + i, prefill=f"p{i % 2}") for i in range(2)]
    named = suspects(summarize(point(records), SLO_))
    assert [(role, worker) for role, worker, _ in named] == [("decode", "d0")]


def test_a_failing_prefill_among_healthy_ones_is_named_and_its_decode_is_not():
    records = [record(i, ok=(i % 2 == 1), prefill=f"p{i % 2}", decode="d0") for i in range(12)]
    named = suspects(summarize(point(records), SLO_))
    assert [(role, worker) for role, worker, _ in named] == [("prefill", "p0")]


def test_a_busy_client_or_machine_is_reported():
    assert verdict(MachineLoad(client_cpu=0.3, host_cpu=0.5), send_lag_p90_ms=1.0) == []
    notes = verdict(MachineLoad(client_cpu=0.95, host_cpu=0.97, loop_lag_p99_ms=40), 30.0)
    assert [kind for kind, _ in notes] == ["client"] * 3 + ["host"]
    assert "used 95% of a core" in notes[0][1] and "97% on average" in notes[3][1]
    busy = MachineLoad(processes={"router": 0.97, "decode-0": 0.4}, saturated=0.3, cores=2)
    assert [text.split(" (")[0] for _, text in verdict(busy, 1.0)] == [
        "host-bound: the deployment's processes on this machine used a whole core",
        "host-bound: this machine's 2 cores were all busy for 30% of the point",
    ]


def fake_measure(capacity: float, noise: list[float] | None = None):
    """Attainment 100% up to `capacity`, falling linearly to 0 at twice it."""
    runs: list[float] = []

    async def measure(rate: float):
        runs.append(rate)
        attainment = max(0.0, min(1.0, 2 - rate / capacity))
        if noise:
            attainment -= noise.pop(0) if noise else 0.0
        records = [record(i, ttft=100 if i < attainment * 100 else 900) for i in range(100)]
        result = PointResult(rate, None, records, 0.0, 10.0, MachineLoad())
        return summarize(result, SLO_)

    return measure, runs


def test_the_search_brackets_the_boundary_within_its_tolerance_and_repeats_it():
    measure, runs = fake_measure(capacity=6.0)
    result = asyncio.run(search_goodput(measure, SLO_, SearchSpec(start=1, tolerance=0.05)))
    # 90% attainment at 2 - r/6 = 0.9 -> r = 6.6
    assert 6.6 * 0.95 <= result.goodput <= 6.6
    assert result.missed_above is not None and result.missed_above > 6.6 * 0.99
    assert len(result.boundary) == 3 and result.confirmed == 3
    assert runs[:4] == [1, 2, 4, 8]
    assert "3 of 3 met 90%" in result.describe(SLO_)


def test_the_search_walks_down_and_reports_no_goodput_when_even_the_floor_misses():
    measure, runs = fake_measure(capacity=0.01)
    result = asyncio.run(search_goodput(measure, SLO_, SearchSpec(start=1, floor=0.2)))
    assert result.goodput == 0 and runs == [1, 0.5, 0.25]
    assert "no rate down to" in result.describe(SLO_)


def test_the_search_counts_a_point_whose_queue_grows_as_missed():
    """Up to 5 req/s TTFT is flat; above it TTFT climbs through the point but stays within the
    400 ms objective, so every request attains: the finite point alone would call 10 req/s
    met. The growing queue makes it a miss, and the note says why."""

    async def measure(rate: float):
        climb = 0.0 if rate <= 5 else 3.4
        records = [record(i, ttft=50 + climb * i) for i in range(100)]
        return summarize(PointResult(rate, None, records, 0.0, 10.0, MachineLoad()), SLO_)

    result = asyncio.run(search_goodput(measure, SLO_, SearchSpec(start=1, tolerance=0.05)))
    assert 5 * 0.95 <= result.goodput <= 5
    above = next(p for p in result.points if p.rate == 8)
    assert above.attainment == 1.0 and above.queue_growing and not above.attainment_met
    assert above.to_json()["queue_growing"] is True  # attainment.png marks it
    assert any("queue still growing" in n and "--search counts it" in n for n in above.notes)
    assert "with a steady queue" in result.describe(SLO_)


def test_a_search_whose_points_are_shorter_than_three_lifetimes_says_how_many_requests():
    # Lifetime under SLO_ with 64 output tokens: 0.4 + 63 x 0.04 = 2.92 s; 100 requests at
    # 2 req/s send for 50 s (17 lifetimes), at 20 req/s for 5 s (1.7).
    spec = WorkloadSpec(count=100)
    for rate, warned in ((2.0, False), (20.0, True)):
        records = [record(i, sent_s=i / rate) for i in range(100)]
        boundary = summarize(PointResult(rate, None, records, 0.0, 10.0, MachineLoad()), SLO_)
        result = SearchResult(rate, rate, None, boundary=[boundary], points=[boundary])
        text = short_points(result, spec, SLO_)
        assert bool(text) is warned
    assert "1.7 request lifetimes" in text and "--requests 176 " in text


def test_cached_tokens_are_summed_by_source_when_the_answers_report_them():
    from kit.bench.client import _cached  # noqa: PLC0415
    from kit.bench.metrics import CacheSummary  # noqa: PLC0415
    from kit.bench.records import RequestRecord  # noqa: PLC0415

    records = [RequestRecord(i, 1.0, False, 1000, 8, ok=True, prompt_tokens=1000) for i in range(3)]
    _cached(records[0], {"prompt_tokens_details": {"cached_tokens": 0}}, None)
    ext = {"cached_tokens_details": {"device": 0, "host": 0, "storage": 960}}
    _cached(records[1], {"prompt_tokens_details": {"cached_tokens": 960}}, ext)
    _cached(records[2], {}, {"cached_tokens_details": {"device": 960, "host": 0}})
    assert (records[1].cached_device, records[1].cached_storage) == (0, 960)
    assert records[2].cached_tokens == 960  # from the details when usage has none
    cache = CacheSummary.of(records)
    assert cache is not None
    assert (cache.cached_tokens, cache.storage_tokens, cache.device_tokens) == (1920, 960, 960)
    assert cache.computed_tokens == 3000 - 1920 and cache.pool_hit_requests == 1
    assert CacheSummary.of([RequestRecord(9, 1.0, False, 10, 1, ok=True)]) is None
