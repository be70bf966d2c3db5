"""The decision engine: what it does with one interval's inputs, and over many."""

from __future__ import annotations

import itertools
import random

import pytest

from kit.autoscale.decide import Inputs, Limits, Memory, Mix, Split, candidates, decide
from kit.autoscale.forecast import forecast
from kit.topology.schema import Topology
from tests.conftest import base_topology

LIMITS = Limits(prefill_min=1, prefill_max=5, decode_min=1, decode_max=5, cooldown_s=60)
CHAT = Mix(10.0, 200, 600)
"""Short prompts, long answers: decodes are what is short."""


def goodputs(current: Split, best: Split, gain: float = 0.5) -> dict[Split, float]:
    """10 req/s for every allowed split, 10 x (1 + gain) for `best`."""
    rated = {s: 10.0 for s in candidates(LIMITS, current)}
    rated[best] = 10.0 * (1 + gain)
    return rated


def inputs(current: Split, best: Split, **changes: object) -> Inputs:
    base: dict[str, object] = {
        "now_s": 1000.0,
        "observed": CHAT,
        "requests": 100,
        "forecast": CHAT,
        "current": current,
        "serving": current,
        "goodput": goodputs(current, best),
    }
    base.update(changes)
    return Inputs(**base)  # type: ignore[arg-type]


def test_a_clearly_better_split_is_chosen_with_its_reason():
    decision, memory = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(2, 4)))
    assert decision.action == "move"
    assert decision.target == Split(2, 4)
    assert decision.moves == -1
    assert "2P4D predicts 15.00 req/s against 3P3D's 10.00 (+50%)" in decision.reason
    assert "from prefill to decode" in decision.reason
    assert memory.last_change_s == 1000.0


def test_a_gain_within_the_hysteresis_holds():
    rated = goodputs(Split(3, 3), Split(2, 4), 0.1)
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(2, 4), goodput=rated))
    assert decision.action == "hold"
    assert "within the hysteresis of 15%" in decision.reason


def test_the_current_split_best_holds():
    rated = {s: 5.0 for s in candidates(LIMITS, Split(3, 3))}
    rated[Split(3, 3)] = 9.0
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(3, 3), goodput=rated))
    assert decision.action == "hold"
    assert "3P3D is the best allowed split" in decision.reason


def test_nothing_moves_while_a_change_is_in_flight():
    decision, memory = decide(
        LIMITS, Memory(), inputs(Split(3, 3), Split(2, 4), in_flight="prefill-2 -> decode")
    )
    assert decision.action == "hold"
    assert "a change is in flight (prefill-2 -> decode)" in decision.reason
    assert memory.last_change_s is None


def test_nothing_moves_while_an_instance_does_not_serve():
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(2, 4), serving=Split(3, 2)))
    assert decision.action == "hold"
    assert "3P2D of 3P3D serve: waiting until every instance serves" in decision.reason


def test_a_quiet_interval_holds():
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(2, 4), requests=3))
    assert decision.action == "hold"
    assert "3 request(s) in the interval" in decision.reason


def test_the_cooldown_holds_then_lets_go():
    memory = Memory(last_change_s=980.0)
    decision, _ = decide(LIMITS, memory, inputs(Split(3, 3), Split(2, 4)))
    assert decision.action == "hold"
    assert "cooldown: the last change was 20 s ago" in decision.reason
    decision, _ = decide(LIMITS, memory, inputs(Split(3, 3), Split(2, 4), now_s=1041.0))
    assert decision.action == "move"


def test_never_below_one_serving_instance_per_role():
    limits = Limits(prefill_min=1, prefill_max=5, decode_min=1, decode_max=5, max_step=3)
    # Every split is allowed by the bounds, but 1P5D gives prefill's only instance away.
    assert Split(0, 6) not in candidates(limits, Split(1, 5))
    assert [s.prefill for s in candidates(limits, Split(1, 5))] == [1, 2, 3, 4]
    # The giver's serving instances count, not its configured ones.
    assert Split(3, 3) not in candidates(limits, Split(5, 1), serving=Split(2, 1))


def test_max_step_and_bounds_limit_the_candidates():
    limits = Limits(prefill_min=2, prefill_max=4, decode_min=2, decode_max=4, max_step=1)
    assert candidates(limits, Split(3, 3)) == [Split(3, 3), Split(2, 4), Split(4, 2)]
    assert candidates(limits, Split(4, 2)) == [Split(4, 2), Split(3, 3)]
    far = Limits(prefill_min=1, prefill_max=5, decode_min=1, decode_max=5, max_step=2)
    assert Split(1, 5) in candidates(far, Split(3, 3))
    assert Split(5, 1) in candidates(far, Split(3, 3))


def test_a_split_outside_the_candidates_is_never_chosen_however_good():
    rated = {Split(3, 3): 10.0, Split(1, 5): 100.0}  # two steps away with max_step 1
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(3, 3), goodput=rated))
    assert decision.action == "hold"


def test_it_stops_acting_after_several_mispredicted_intervals_and_says_so():
    memory = Memory()
    wild = [Mix(10, 200, 600), Mix(40, 200, 600), Mix(5, 200, 600), Mix(50, 200, 600)]
    actions = []
    for i, observed in enumerate(wild):
        # The forecast for the next interval is always the steady 10 req/s.
        step = inputs(Split(3, 3), Split(2, 4), observed=observed, now_s=1000.0 + 200 * i)
        decision, memory = decide(LIMITS, memory, step)
        actions.append(decision.action)
    assert actions[:3] == ["move", "move", "move"]
    assert actions[3] == "paused"
    assert "forecasts off by more than 50% (plus the sampling noise" in decision.reason
    assert "for 3 interval(s) in a row" in decision.reason
    # One forecast that holds and it acts again.
    good = inputs(Split(3, 3), Split(2, 4), observed=Mix(10, 200, 600), now_s=5000.0)
    decision, memory = decide(LIMITS, memory, good)
    assert decision.action == "move"
    assert memory.mispredicted == 0


def test_a_short_intervals_sampling_noise_is_not_a_misprediction():
    """25 requests in an interval (4 req/s over 6 s): an 80% miss is within Poisson noise and
    never pauses it; the same miss over 400 requests is a real one."""
    assert LIMITS.tolerance(25) == pytest.approx(0.5 + 2 / 5)
    for requests, paused in ((25, False), (400, True)):
        memory = Memory()
        actions = []
        for i in range(4):
            observed = Mix(10 * (1.8 if i % 2 else 1 / 1.8), 200, 600)  # off by 80% each time
            step = inputs(
                Split(3, 3), Split(3, 3), observed=observed, requests=requests, now_s=1000.0 + i
            )
            decision, memory = decide(LIMITS, memory, step)
            actions.append(decision.action)
        assert ("paused" in actions) is paused, (requests, actions)


def test_the_forecast_error_is_the_worst_of_rate_and_lengths():
    assert Mix(10, 200, 600).error(Mix(10, 200, 600)) == 0
    assert Mix(10, 200, 600).error(Mix(10, 400, 600)) == pytest.approx(1.0)
    assert Mix(10, 400, 600).error(Mix(10, 200, 600)) == pytest.approx(1.0)  # symmetric
    assert Mix(12, 200, 600).error(Mix(10, 200, 300)) == pytest.approx(1.0)


def test_a_steady_noisy_workload_never_flaps():
    """Ten minutes of 10 s intervals: the true best split is 3P3D, the model's answers
    wobble by up to 10% per split, the observed rate by 20%."""
    rng = random.Random(7)
    memory = Memory()
    predicted: Mix | None = None
    current = Split(3, 3)
    moves = 0
    truth = {Split(p, 6 - p): 10.0 - abs(p - 3) for p in range(1, 6)}
    for i in range(60):
        observed = Mix(10 * rng.uniform(0.8, 1.2), 200 * rng.uniform(0.9, 1.1), 600)
        predicted = forecast(predicted, observed)
        rated = {s: g * rng.uniform(0.9, 1.1) for s, g in truth.items()}
        step = Inputs(i * 10.0, observed, 100, predicted, current, current, rated)
        decision, memory = decide(LIMITS, memory, step)
        moves += decision.action == "move"
        assert decision.action != "paused"
    assert moves == 0


def test_a_shift_moves_once_then_settles():
    """The workload turns from long answers to long prompts: prefills become the bottleneck.
    The engine moves one step per cooldown until the best split, then holds."""
    memory = Memory()
    current = Split(2, 4)
    history = []
    for i in range(40):
        best = 2 if i < 10 else 4
        rated = {Split(p, 6 - p): 10.0 * (1 - 0.2 * abs(p - best)) for p in range(1, 6)}
        step = Inputs(i * 30.0, CHAT, 100, CHAT, current, current, rated)
        decision, memory = decide(LIMITS, memory, step)
        current = decision.target
        history.append(current.prefill)
    assert history[:10] == [2] * 10
    assert history[-1] == 4
    changes = sum(1 for a, b in itertools.pairwise(history) if a != b)
    assert changes == 2


def test_the_limits_come_from_the_topology():
    data = base_topology()
    data["prefill"] = {"count": 2, "tp": 2, "hosts": ["a"]}
    data["decode"] = {"count": 2, "tp": 2, "hosts": ["b"]}
    data["autoscale"] = {"decode": {"min": 2}, "cooldown_s": 5, "max_step": 2}
    limits = Limits.of(Topology.model_validate(data))
    assert (limits.prefill_min, limits.prefill_max) == (1, 2)
    assert (limits.decode_min, limits.decode_max) == (2, 3)
    assert limits.cooldown_s == 5 and limits.max_step == 2


def test_when_no_split_meets_the_slo_it_holds_and_says_so():
    rated = dict.fromkeys(candidates(LIMITS, Split(3, 3)), 0.0)
    decision, _ = decide(LIMITS, Memory(), inputs(Split(3, 3), Split(3, 3), goodput=rated))
    assert decision.action == "hold"
    assert "no allowed split meets the SLO by the model" in decision.reason


def test_the_forecast_blends_a_wobble_and_restarts_at_a_step():
    steady = forecast(Mix(10, 200, 600), Mix(12, 220, 580), reset=0.5)
    assert steady == Mix(11, 210, 590)
    shifted = forecast(Mix(10, 200, 600), Mix(10, 3000, 8), reset=0.5)
    assert shifted == Mix(10, 3000, 8)
    assert forecast(Mix(10, 200, 600), None, reset=0.5) == Mix(10, 200, 600)


def test_prefills_that_finish_nothing_while_requests_pile_up_get_one_more_instance():
    """The shift to long prompts: the only prefill finishes nothing in the interval, so no
    finished request tells the new prompts' length, but 30 requests wait on it."""
    blind = inputs(Split(1, 5), Split(1, 5), observed=None, requests=12, stalled=30, goodput={})
    decision, memory = decide(LIMITS, Memory(), blind)
    assert (decision.action, decision.target) == ("move", Split(2, 4))
    assert "finished no request in the interval while 30 waited" in decision.reason
    # Within the cooldown it holds and says both.
    again = inputs(Split(2, 4), Split(2, 4), observed=None, stalled=30, now_s=1010.0, goodput={})
    decision, _ = decide(LIMITS, memory, again)
    assert decision.action == "hold" and "cooldown" in decision.reason
    # A few requests waiting at a light load are no stall; nor is a stall at the bounds.
    light = inputs(Split(1, 5), Split(1, 5), observed=None, requests=3, stalled=2, goodput={})
    assert decide(LIMITS, Memory(), light)[0].action == "hold"
    full = inputs(Split(5, 1), Split(5, 1), observed=None, stalled=30, goodput={})
    decision, _ = decide(LIMITS, Memory(), full)
    assert decision.action == "hold" and "allow no more prefills" in decision.reason


def test_a_stall_with_a_measured_workload_is_the_model_s_to_size():
    """The router's count of the arriving prompts measured the new workload: the model may
    move more than the stall rule's one instance."""
    wide = Limits(prefill_min=1, prefill_max=5, decode_min=1, decode_max=5, max_step=4)
    rated = {s: 1.0 for s in candidates(wide, Split(1, 5))}
    rated[Split(5, 1)] = 5.0
    seen = inputs(Split(1, 5), Split(1, 5), stalled=30, goodput=rated)
    decision, _ = decide(wide, Memory(), seen)
    assert (decision.action, decision.target) == ("move", Split(5, 1))
    assert "5P1D predicts" in decision.reason and "finished no request" not in decision.reason
