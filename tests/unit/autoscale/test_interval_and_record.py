"""One interval read from two scrapes, and the record `pdkit status` and /metrics show."""

from __future__ import annotations

import pytest

from kit.autoscale import record
from kit.autoscale.decide import Decision, Mix, Split
from kit.autoscale.observe import Scrape, arrival_shift, interval
from kit.observe.prom import parse_metrics
from kit.topology.schema import SLO

ROUTER = """
pdkit_lb_requests_total{{route="/v1/chat/completions",status="200"}} {chat}
pdkit_lb_requests_total{{route="/health",status="200"}} {health}
pdkit_lb_time_to_first_token_seconds_bucket{{route="chat",le="0.1"}} {fast}
pdkit_lb_time_to_first_token_seconds_bucket{{route="chat",le="1.0"}} {chat}
pdkit_lb_time_to_first_token_seconds_bucket{{route="chat",le="+Inf"}} {chat}
pdkit_lb_time_to_first_token_seconds_count{{route="chat"}} {chat}
pdkit_lb_time_to_first_token_seconds_sum{{route="chat"}} 1
pdkit_lb_inter_token_latency_seconds_bucket{{route="chat",le="0.01"}} {gaps}
pdkit_lb_inter_token_latency_seconds_bucket{{route="chat",le="+Inf"}} {gaps}
pdkit_lb_inter_token_latency_seconds_count{{route="chat"}} {gaps}
pdkit_lb_inter_token_latency_seconds_sum{{route="chat"}} 1
"""
WORKER = """
sglang:num_requests_total{{model_name="m",is_streaming="true"}} {requests}
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
sglang:generation_tokens_total{{model_name="m"}} {generated}
"""


def scrape(at: float, chat: int, health: int, roles: dict[str, tuple[int, int, int]]) -> Scrape:
    router = ROUTER.format(chat=chat, health=health, fast=chat // 2, gaps=chat * 10)
    workers = {
        name: parse_metrics(WORKER.format(requests=r, prompt=p, generated=g))
        for name, (r, p, g) in roles.items()
    }
    return Scrape(at, parse_metrics(router), workers)


def test_the_interval_counts_generate_requests_and_each_role_s_tokens():
    roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "prefill"}
    before = scrape(
        0, 100, 50, {"prefill-0": (10, 1000, 10), "decode-0": (10, 0, 500), "decode-1": (0, 0, 0)}
    )
    # 40 chat requests in 10 s (the 30 health checks do not count); decode-1 serves as a
    # prefill now (switched), so its prompt tokens count as a prefill's.
    now = scrape(
        10,
        140,
        80,
        {"prefill-0": (30, 5000, 30), "decode-0": (50, 0, 8500), "decode-1": (20, 4000, 20)},
    )
    seen = interval(before, now, roles, "pdkit", SLO(ttft_ms=400, tpot_ms=40))
    assert seen.requests == 40
    assert seen.mix == Mix(4.0, (4000 + 4000) / 40, 8000 / 40)
    assert seen.observed is not None
    assert seen.observed.latencies.p50_ttft_ms == pytest.approx(100.0)
    assert seen.observed.attainment == pytest.approx(0.5 + 0.5 * 0.3 / 0.9)
    assert "4.00 req/s, 200 in / 200 out tokens (40 finished in 10 s)" in seen.describe()


def test_a_quiet_interval_has_no_mix():
    same = {"prefill-0": (10, 1000, 10), "decode-0": (10, 0, 500)}
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    seen = interval(scrape(0, 100, 1, same), scrape(5, 100, 9, same), roles, "pdkit", SLO())
    assert (seen.requests, seen.mix, seen.observed) == (0, None, None)


def test_prefills_that_finish_nothing_while_work_waits_are_a_stall():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    before = {"prefill-0": (10, 1000, 10), "decode-0": (10, 0, 500)}
    after = {"prefill-0": (10, 1000, 10), "decode-0": (22, 0, 900)}  # decodes finish; prefill not
    first, then = scrape(0, 100, 1, before), scrape(6, 112, 1, after)
    queue = "sglang:num_queue_reqs 25\nsglang:num_running_reqs 8\n"
    workers = dict(then.workers)
    workers["prefill-0"] = parse_metrics(
        WORKER.format(requests=10, prompt=1000, generated=10) + queue
    )
    stalled = Scrape(then.at, then.router, workers)
    seen = interval(first, stalled, roles, "pdkit", SLO(ttft_ms=400, tpot_ms=40))
    assert (seen.requests, seen.mix, seen.stalled) == (12, None, 33)
    assert "the prefills finished none while 33 wait on them" in seen.describe()
    # An interval shorter than the TTFT objective says nothing yet; nor does an idle prefill.
    assert interval(first, stalled, roles, "pdkit", SLO(ttft_ms=8000, tpot_ms=40)).stalled == 0
    assert interval(first, then, roles, "pdkit", SLO(ttft_ms=400, tpot_ms=40)).stalled == 0


def test_a_stall_counts_the_bootstrap_queue_and_what_the_router_has_sent():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    same = {"prefill-0": (10, 1000, 10), "decode-0": (10, 0, 500)}
    first, then = scrape(0, 100, 1, same), scrape(6, 112, 1, same)
    # 2 queued, 1 running and 30 waiting for their decode's room (the bootstrap queue).
    held = "sglang:num_queue_reqs 2\nsglang:num_running_reqs 1\n"
    held += "sglang:num_prefill_bootstrap_queue_reqs 30\n"
    workers = dict(then.workers)
    workers["prefill-0"] = parse_metrics(
        WORKER.format(requests=10, prompt=1000, generated=10) + held
    )
    slo = SLO(ttft_ms=400, tpot_ms=40)
    assert interval(first, Scrape(6, then.router, workers), roles, "pdkit", slo).stalled == 33
    # The router has 41 out on the prefill (8 of them not yet in its queues): the larger.
    text = ROUTER.format(chat=112, health=1, fast=56, gaps=1120)
    text += 'pdkit_lb_worker_inflight{worker="http://p0",role="prefill"} 41\n'
    text += 'pdkit_lb_worker_inflight{worker="http://d0",role="decode"} 50\n'
    router = parse_metrics(text)
    assert interval(first, Scrape(6, router, workers), roles, "pdkit", slo).stalled == 41


def test_a_worker_that_did_not_answer_counts_from_its_last_answer():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    start = scrape(0, 100, 1, {"prefill-0": (10, 1000, 10), "decode-0": (10, 0, 500)})
    missed = Scrape(6, scrape(6, 112, 1, {}).router, {"prefill-0": None, "decode-0": None})
    now = scrape(12, 124, 1, {"prefill-0": (34, 73000, 34), "decode-0": (34, 0, 692)})
    slo = SLO(ttft_ms=400, tpot_ms=40)
    # Without its last answer the interval after a missed scrape knows no length ...
    assert interval(missed, now, roles, "pdkit", slo).mix is None
    # ... with it, 24 prefills of 3000 tokens over both intervals, 12 requests in this one.
    answered = {name: m for name, m in start.workers.items() if m is not None}
    seen = interval(missed.filled(answered), now, roles, "pdkit", slo)
    assert seen.mix == Mix(2.0, 3000, 8)


def routed(at: float, chat: int, received: int, tokens: float, roles) -> Scrape:
    base = scrape(at, chat, 1, roles)
    text = ROUTER.format(chat=chat, health=1, fast=chat // 2, gaps=chat * 10)
    text += f"pdkit_lb_received_total {received}\n"
    text += f"pdkit_lb_received_prompt_tokens_total {tokens}\n"
    return Scrape(at, parse_metrics(text), base.workers)


def test_the_rate_and_prompts_come_from_what_the_router_received():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    before = routed(
        0, 100, 110, 110 * 1000, {"prefill-0": (10, 10000, 10), "decode-0": (10, 0, 500)}
    )
    # 60 arrived in 10 s (40 finished); the router's estimate (1100 tokens) is within 2x of
    # the prefills' own count (1000), which is the exact one and is kept.
    now = routed(
        10,
        140,
        170,
        110 * 1000 + 60 * 1100,
        {"prefill-0": (50, 50000, 50), "decode-0": (50, 0, 8500)},
    )
    seen = interval(before, now, roles, "pdkit", SLO(ttft_ms=400, tpot_ms=40))
    assert seen.mix == Mix(6.0, 1000, 200)
    assert (seen.requests, seen.arrived, seen.samples, seen.shifted) == (40, 60, 60, False)
    assert seen.observed is not None
    assert "(40 finished, 60 arrived in 10 s)" in seen.describe()


def test_at_a_shift_the_arriving_prompts_count_and_the_old_latencies_are_not_fitted():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    before = routed(
        0, 100, 100, 100 * 128, {"prefill-0": (100, 12800, 100), "decode-0": (90, 0, 23040)}
    )
    # Long prompts arrive (30 of 3000 tokens); the prefill finished 2 short ones, the decodes
    # the old long answers.
    now = routed(
        6,
        112,
        130,
        100 * 128 + 30 * 3000,
        {"prefill-0": (102, 13056, 102), "decode-0": (102, 0, 26112)},
    )
    seen = interval(before, now, roles, "pdkit", SLO(ttft_ms=400, tpot_ms=40))
    assert seen.mix == Mix(5.0, 3000, 256)
    assert seen.shifted and seen.observed is None
    assert "the workload shifted" in seen.describe()


def decision_record(tmp_path, action="move"):
    decision = Decision(action, Split(3, 3), Split(2, 4), "2P4D predicts more", 10.0, 15.0, 0.1)
    rec = record.DecisionRecord.of(
        decision,
        at=1000.0,
        interval="4.00 req/s",
        observed=Mix(4, 200, 600),
        forecast=Mix(4.2, 210, 590),
        efficiency={"compute": 0.5, "memory": 0.7},
        fit="kept",
        mispredicted=0,
        roles={"prefill-0": "prefill"},
        applied="switched prefill-2 prefill -> decode in 1.2 s",
    )
    record.save(tmp_path, rec)
    return rec


def test_the_record_round_trips_and_status_shows_it(tmp_path):
    rec = decision_record(tmp_path)
    assert record.load(tmp_path) == rec
    line, data = record.status_section(tmp_path)
    assert line.startswith("Autoscale: ")
    assert "move 3P3D -> 2P4D (2P4D predicts more); switched prefill-2" in line
    assert data["target"] == "2P4D"
    assert record.status_section(tmp_path / "elsewhere") is None


def test_the_metrics_export_the_decision(tmp_path):
    text = record.metrics_text(decision_record(tmp_path))
    metrics = parse_metrics(text)
    assert metrics.total("pdkit_autoscale_instances", role="decode", split="target") == 4
    assert metrics.total("pdkit_autoscale_predicted_goodput", split="target") == 15
    assert metrics.total("pdkit_autoscale_action", action="move") == 1
    assert metrics.total("pdkit_autoscale_efficiency", factor="compute") == 0.5
    assert metrics.total("pdkit_autoscale_forecast", what="rate") == 4.2


def test_counters_that_first_appear_in_the_interval_count_from_zero():
    # Before the first request a labelled counter has no series at all.
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    empty = Scrape(
        0, parse_metrics(""), {"prefill-0": parse_metrics(""), "decode-0": parse_metrics("")}
    )
    now = scrape(5, 20, 0, {"prefill-0": (20, 4000, 20), "decode-0": (20, 0, 200)})
    seen = interval(empty, now, roles, "pdkit", SLO())
    assert seen.requests == 20
    assert seen.mix == Mix(4.0, 200, 10)


def test_an_interval_ends_early_when_the_arriving_prompts_shift():
    def router(received: int, tokens: float):
        return parse_metrics(
            f"pdkit_lb_received_total {received}\npdkit_lb_received_prompt_tokens_total {tokens}\n"
        )

    start = router(100, 100 * 128)
    # 10 long prompts arrived against a forecast of 128 tokens: end the interval now.
    reason = arrival_shift(start, router(110, 100 * 128 + 10 * 3000), 128, 8)
    assert reason == "10 requests arrived with 3000-token prompts against 128 forecast"
    # Too few yet, a change within 2x, or a router without the counters: wait.
    assert arrival_shift(start, router(105, 100 * 128 + 5 * 3000), 128, 8) is None
    assert arrival_shift(start, router(110, 100 * 128 + 10 * 200), 128, 8) is None
    assert arrival_shift(start, parse_metrics("x_total 1\n"), 128, 8) is None


def test_at_a_shift_with_no_answer_finished_the_forecast_s_answer_length_stands_in():
    roles = {"prefill-0": "prefill", "decode-0": "decode"}
    same = {"prefill-0": (100, 12800, 100), "decode-0": (100, 0, 25600)}
    before, now = routed(0, 100, 100, 100 * 128, same), routed(2, 100, 110, 100 * 128 + 30000, same)
    slo = SLO(ttft_ms=400, tpot_ms=40)
    assert interval(before, now, roles, "pdkit", slo).mix is None
    seen = interval(before, now, roles, "pdkit", slo, output_tokens=256)
    assert seen.mix == Mix(5.0, 3000, 256) and seen.shifted
