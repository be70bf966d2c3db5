"""The scheduler in virtual time: batching, KV capacity, PD phases."""

from __future__ import annotations

import pytest

from kit.perf.clock import VirtualClock
from kit.perf.gpus import gpu_spec
from kit.perf.kv_pages import KvPages
from kit.perf.models import resolve_model
from kit.perf.scheduler import FinishReason, Mode, Phase, Scheduler, Sequence
from kit.perf.timing import StepShape, TimingModel
from kit.topology.launch import Parallelism


class Sink:
    """Records what a sequence saw (model seconds)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.finish: FinishReason | None = None
        self.finished_at: float | None = None
        self.prefilled_at: float | None = None
        self.reserved_at: float | None = None

    def on_token(self, seq, now, reason):
        self.times.append(now)
        return reason

    def on_finish(self, seq, reason, now):
        self.finish, self.finished_at = reason, now

    def on_prefilled(self, seq, now):
        self.prefilled_at = now

    def on_reserved(self, seq, now):
        self.reserved_at = now


def make(mode=Mode.NULL, pages=4096, page_size=16, max_running=256, chunk=8192, **kw):
    clock = VirtualClock()
    timing = TimingModel(resolve_model("Llama-3.1-8B"), gpu_spec("H100-SXM"), Parallelism())
    sched = Scheduler(
        mode=mode,
        timing=timing,
        pool=KvPages(pages, page_size),
        clock=clock,
        max_running=max_running,
        chunk_size=chunk,
        **kw,
    )
    return sched, clock, timing


def seq(rid="r", prompt=512, out=8, **kw):
    sink = Sink()
    return Sequence(rid, prompt, out, sink, **kw), sink


def test_colocated_request_takes_one_prefill_then_one_step_per_token():
    sched, clock, timing = make()
    s, sink = seq(prompt=512, out=8)
    sched.submit(s)
    clock.run()
    prefill = timing.step_seconds(StepShape(prefill=((512, 0),), sampled=1))
    assert sink.times[0] == pytest.approx(prefill)
    assert len(sink.times) == 8
    assert sink.finish == FinishReason("length", length=8)
    gaps = [b - a for a, b in zip(sink.times, sink.times[1:], strict=False)]
    step = timing.step_seconds(StepShape(decode_reqs=1, decode_context=513, sampled=1))
    assert gaps[0] == pytest.approx(step)
    assert sched.pool.free_pages == sched.pool.total_pages  # KV released


def test_long_prompt_is_chunked_and_costs_more_steps():
    sched, clock, _ = make(chunk=1024)
    s, _sink = seq(prompt=3000, out=2)
    sched.submit(s)
    clock.run()
    assert sched.stats.steps == 3 + 1  # three prefill chunks, one decode step
    assert sched.stats.prompt_tokens == 3000


def test_prefill_interrupts_decodes_in_colocated_mode():
    """A new prompt stalls every running decode: the interference PD removes."""
    sched, clock, timing = make()
    first, sink = seq("a", prompt=64, out=40)
    sched.submit(first)
    clock.run(until=0.2)
    late, _ = seq("b", prompt=4096, out=2)
    sched.submit(late)
    clock.run()
    gaps = [b - a for a, b in zip(sink.times, sink.times[1:], strict=False)]
    prefill = timing.step_seconds(StepShape(prefill=((4096, 0),), sampled=1))
    assert max(gaps) >= prefill  # one inter-token gap holds the whole 4096-token prefill
    assert min(gaps) < prefill / 5


def test_mixed_chunk_carries_decodes_in_the_prefill_step():
    sched, clock, _ = make(mixed_chunk=True)
    first, sink = seq("a", prompt=64, out=40)
    sched.submit(first)
    clock.run(until=0.2)
    tokens_before = len(sink.times)
    sched.submit(seq("b", prompt=4096, out=2)[0])
    clock.run()
    assert len(sink.times) == 40 and tokens_before < 40


def test_kv_capacity_bounds_running_requests_and_queues_the_rest():
    sched, clock, _ = make(pages=64, page_size=16)  # 1024 tokens of KV
    sinks = []
    for i in range(6):
        s, sink = seq(str(i), prompt=300, out=4)
        sinks.append(sink)
        sched.submit(s)
    clock.run(until=1e-9)
    assert sched.stats.steps == 0
    clock.run()
    assert all(s.finish is not None and s.finish.kind == "length" for s in sinks)
    firsts = sorted(s.times[0] for s in sinks)
    assert firsts[-1] > firsts[0]  # later ones waited for KV room


def test_a_prompt_larger_than_the_pool_is_refused():
    sched, clock, _ = make(pages=8, page_size=16)
    s, sink = seq(prompt=1000, out=2)
    sched.submit(s)
    clock.run()
    assert sink.finish is not None and sink.finish.kind == "abort"
    assert "KV memory budget" in sink.finish.message


def test_decode_growth_retracts_the_newest_request_and_resumes_it():
    sched, clock, _ = make(pages=40, page_size=1, max_running=8)
    sinks = []
    for i in range(3):
        s, sink = seq(str(i), prompt=10, out=12)
        sinks.append(sink)
        sched.submit(s)
    clock.run()
    assert sched.stats.retracted >= 1
    assert all(s.finish is not None and s.finish.kind == "length" for s in sinks)
    assert all(len(s.times) >= 12 for s in sinks)


def test_prefill_mode_holds_kv_until_the_transfer_is_done():
    sched, clock, _ = make(mode=Mode.PREFILL)
    s, sink = seq(prompt=512, out=64)
    sched.submit(s)
    clock.run()
    assert sink.prefilled_at is not None and s.phase is Phase.INFLIGHT
    assert sched.pool.used_pages == 32
    sched.transfer_done(s)
    assert sink.finish == FinishReason("length", length=0)
    assert sched.pool.used_pages == 0


def test_decode_mode_reserves_then_decodes_from_the_first_transferred_token():
    sched, clock, _timing = make(mode=Mode.DECODE)
    s, sink = seq(prompt=512, out=4)
    sched.submit(s)
    assert sink.reserved_at == 0.0 and s.phase is Phase.TRANSFER
    assert len(s.page_ids) == 32
    clock.call_at(0.05, lambda: sched.kv_arrived(s))
    clock.run()
    assert sink.times[0] == pytest.approx(0.05)  # first token comes with the KV
    assert len(sink.times) == 4
    assert sched.pool.used_pages == 0


def test_decode_reservation_limits_admission():
    sched, _clock, _ = make(mode=Mode.DECODE, pages=200, page_size=16, reserved_decode_tokens=512)
    seqs = [seq(str(i), prompt=400)[0] for i in range(4)]
    for s in seqs:
        sched.submit(s)
    # 3200 tokens of KV; admitting the k-th request needs its 400 prompt tokens plus 512
    # reserved decode tokens for each of the k active requests: 912 + 1424 + 1936 fit in
    # turn, the fourth (2448 > 2000 left) waits.
    assert [s.phase for s in seqs].count(Phase.TRANSFER) == 3
    assert len(sched.prealloc) == 1


def test_decode_extra_slots_let_more_requests_wait_for_their_kv_than_run():
    # SGLang's DecodeReqToTokenPool: max_running + extra slots, shared by the transferring
    # and the running requests; without the extras a decode whose slots wait on a slow
    # prefill holds every later request (a new prefill's too) in prealloc.
    sched, clock, _ = make(mode=Mode.DECODE, max_running=2, extra_slots=4)
    seqs = [seq(str(i), prompt=64, out=50)[0] for i in range(8)]
    for s in seqs:
        sched.submit(s)
    assert [s.phase for s in seqs].count(Phase.TRANSFER) == 6
    assert len(sched.prealloc) == 2
    for s in seqs[:6]:
        sched.kv_arrived(s)
    clock.run(until=0.01)
    assert len(sched.running) == 2  # at most max_running decode at once
    assert len(sched.ready) == 4
    plain, _, _ = make(mode=Mode.DECODE, max_running=2)
    for s in [seq(str(i), prompt=64)[0] for i in range(8)]:
        plain.submit(s)
    assert len(plain.transfer) == 2 and len(plain.prealloc) == 6


def test_abort_frees_kv_anywhere():
    sched, _clock, _ = make(mode=Mode.DECODE)
    s, sink = seq(prompt=512)
    sched.submit(s)
    sched.abort(s, FinishReason("abort", message="gone"))
    assert sink.finish is not None and sink.finish.message == "gone"
    assert sched.pool.used_pages == 0 and sched.idle


def test_same_workload_same_times():
    def run():
        sched, clock, _ = make()
        sinks = []
        for i in range(20):
            s, sink = seq(str(i), prompt=100 + 10 * i, out=5)
            sinks.append(sink)
            clock.call_at(i * 0.01, lambda s=s: sched.submit(s))
        clock.run()
        return [tuple(s.times) for s in sinks]

    assert run() == run()


def test_abort_can_hold_kv_pages_until_the_caller_frees_them():
    sched, _, _ = make(mode=Mode.DECODE)
    s, sink = seq(prompt=512)
    sched.submit(s)
    held = sched.abort(s, FinishReason("abort", message="client gone"), hold_kv=True)
    assert len(held) == 32 and sched.pool.used_pages == 32  # a transfer may still land
    assert sink.finish is not None
    sched.free_pages(held)
    assert sched.pool.used_pages == 0
