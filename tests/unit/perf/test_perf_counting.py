"""CountingScheduler serves exactly as Scheduler does: same steps, times, retractions, pages in
use, finishes (its sinks hear only the first and the last token)."""

from __future__ import annotations

import random

import pytest

from kit.perf.clock import VirtualClock
from kit.perf.counting import CountingScheduler
from kit.perf.gpus import gpu_spec
from kit.perf.kv_pages import KvPages
from kit.perf.models import resolve_model
from kit.perf.scheduler import FinishReason, Mode, Scheduler, Sequence, Step
from kit.perf.timing import TimingModel
from kit.topology.launch import Parallelism

TIMING = TimingModel(resolve_model("Llama-3.1-8B"), gpu_spec("H100-SXM"), Parallelism())


class Sink:
    """Records the first token, the end, and the count at the end; lets a model's end of
    answer pass only `late` tokens after it (a sink that suppresses a stop); moves the KV of a
    prefill or to a decode in a millisecond."""

    def __init__(self, late: int, sched: Scheduler, clock: VirtualClock) -> None:
        self.late = late
        self.sched = sched
        self.clock = clock
        self.first: float | None = None
        self.end: tuple[FinishReason, float, int] | None = None
        self.prefilled: float | None = None
        self.suppressed = 0

    def on_token(self, seq, now, reason):
        if self.first is None:
            self.first = now
        if (
            reason is not None
            and reason.kind == "stop"
            and seq.generated < seq.eos_after + self.late
        ):
            self.suppressed += 1
            return None
        return reason

    def on_finish(self, seq, reason, now):
        self.end = (reason, now, seq.generated)

    def on_prefilled(self, seq, now):
        self.prefilled = now
        self.clock.call_at(now + 0.001, lambda: self.sched.transfer_done(seq))

    def on_reserved(self, seq, now):
        self.clock.call_at(now + 0.001, lambda: self.sched.kv_arrived(seq))


def serve(kind: type[Scheduler], mode: Mode, case: random.Random, **knobs):
    """Serve the requests `case` draws on a `kind` scheduler; everything a user could see."""
    clock = VirtualClock()
    steps: list[tuple[float, float, int, int, int]] = []

    def on_step(rank: Scheduler, step: Step) -> None:
        steps.append(
            (step.start, step.end, len(step.prefill), len(step.decode), rank.pool.free_pages)
        )

    sched = kind(
        mode=mode,
        timing=TIMING,
        pool=KvPages(knobs.pop("pages"), knobs.pop("page_size")),
        clock=clock,
        on_step=on_step,
        **knobs,
    )
    sinks = []
    arrival = 0.0
    for i in range(case.randint(20, 60)):
        arrival += case.expovariate(200)
        sink = Sink(case.choice([0, 0, 3]), sched, clock)
        eos = case.choice([None, None, case.randint(1, 40)])
        seq = Sequence(f"r{i}", case.randint(1, 400), case.randint(1, 80), sink, eos_after=eos)
        sinks.append(sink)
        clock.call_at(arrival, lambda seq=seq: sched.submit(seq))
    clock.run()
    seen = [(s.first, s.end, s.prefilled) for s in sinks]
    return seen, steps, sched.new_token_ratio, sched.pool.free_pages, sched.stats, sinks


def knobs(seed: int) -> tuple[Mode, dict]:
    pick = random.Random(seed)
    mode = [Mode.NULL, Mode.NULL, Mode.DECODE, Mode.PREFILL][seed % 4]
    return mode, {
        "pages": pick.choice([200, 800, 5000]),  # small pools retract
        "page_size": pick.choice([1, 4, 16]),
        "max_running": pick.choice([4, 64]),
        "chunk_size": pick.choice([0, 256, 4096]),
        "mixed_chunk": pick.random() < 0.5,
        "reserved_decode_tokens": pick.choice([0, 64]),
        "extra_slots": pick.choice([0, 4]),
    }


SEEDS = range(16)


@pytest.mark.parametrize("seed", SEEDS)
def test_counting_serves_as_the_token_by_token_scheduler(seed):
    mode, kw = knobs(seed)
    exact = serve(Scheduler, mode, random.Random(seed), **kw)
    counted = serve(CountingScheduler, mode, random.Random(seed), **kw)
    assert counted[:-1] == exact[:-1]


def test_the_cases_retract_and_suppress_an_end_of_answer():
    # The paths where counting could go wrong are taken by the cases above.
    retracted = suppressed = 0
    for seed in SEEDS:
        mode, kw = knobs(seed)
        *_, stats, sinks = serve(CountingScheduler, mode, random.Random(seed), **kw)
        retracted += stats.retracted
        suppressed += sum(sink.suppressed for sink in sinks)
    assert retracted > 0
    assert suppressed > 0
