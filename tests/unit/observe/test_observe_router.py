"""The router judged from its answers, for both kinds: readiness, its worker view, traffic, SLO."""

from __future__ import annotations

import pytest

from kit.lb.processes import merge_metrics
from kit.observe.probe import Fetched, RouterAnswers
from kit.observe.router import evaluate_router
from kit.observe.view import router_lines
from kit.topology.schema import SLO
from tests.support.observe_builders import (
    D0,
    P0,
    P1,
    SMG_METRICS,
    SMG_WORKERS,
    pdkit_answers,
    pdkit_metrics,
)
from tests.support.observe_builders import router_got as got
from tests.support.observe_builders import router_target as target


def test_pdkit_router_ready_with_its_worker_view_rates_and_latency():
    earlier = got("/metrics", pdkit_metrics(requests=20), at=98.0)
    status = evaluate_router(pdkit_answers(at=100.0), SLO(), earlier)
    assert status.state == "healthy" and status.ready is True and not status.problems
    assert (status.healthy_prefill, status.total_prefill) == (2, 2)
    assert (status.healthy_decode, status.total_decode) == (1, 1)
    assert status.workers is not None and {w.url for w in status.workers} == {P0, P1, D0}
    assert status.requests_total == 40 and status.requests_per_s == pytest.approx(10.0)
    assert status.inflight == 3
    assert status.ttft is not None and status.ttft.count == 40
    assert status.ttft.p50_ms == pytest.approx(200.0)
    assert status.ttft.within == pytest.approx(0.9)  # 36 of 40 within 400 ms
    assert status.tpot is not None and status.tpot.within == pytest.approx(0.9)
    assert status.tpot_is_itl and status.slo_met is True


def test_slo_missed_when_a_share_is_below_the_attainment():
    status = evaluate_router(pdkit_answers(), SLO(ttft_ms=200, tpot_ms=40, attainment=0.9))
    assert status.ttft is not None and status.ttft.within == pytest.approx(0.5)
    assert status.slo_met is False


def test_a_router_with_no_healthy_decode_is_not_ready_and_says_why():
    metrics = pdkit_metrics(healthy={P0: 1, P1: 1, D0: 0})
    status = evaluate_router(pdkit_answers(ready=False, metrics=metrics), SLO())
    assert status.state == "unhealthy" and status.ready is False
    assert status.cause == "not ready: no healthy decode"
    assert (status.healthy_decode, status.total_decode) == (0, 1)
    assert status.workers is not None
    decode = next(w for w in status.workers if w.url == D0)
    assert not decode.healthy and decode.state == "unhealthy" and decode.reason == "health_check"


def test_a_draining_pdkit_router_is_draining():
    status = evaluate_router(
        pdkit_answers(
            ready=False,
            metrics=pdkit_metrics(drain=1),
            health=got("/health", {"status": "draining"}),
        ),
        SLO(),
    )
    assert status.state == "draining" and status.ready is False


def test_a_router_that_is_not_there_is_down():
    gone = Fetched("http://10.0.0.1:8000/x", failure="refused", detail="connection refused")
    status = evaluate_router(RouterAnswers(target(), gone, gone, gone, gone), SLO())
    assert status.state == "down" and status.cause == "connection refused"
    assert status.workers is None and status.requests_total is None


def test_smg_router_worker_list_and_metrics_on_their_own_port():
    answers = RouterAnswers(
        target("smg"),
        got("/health", "OK"),
        got("/readiness", {"status": "not ready", "healthy_workers": 1, "total_workers": 2}, 503),
        got("/workers", SMG_WORKERS),
        got("/metrics", SMG_METRICS),
    )
    status = evaluate_router(answers, SLO())
    assert status.kind == "smg" and status.state == "unhealthy"
    assert status.cause == "not ready: no healthy decode"
    assert (status.healthy_prefill, status.healthy_decode) == (1, 0)
    assert status.workers is not None and status.workers[1].state == "failed"
    assert status.requests_total == 12  # client requests, not the probes
    assert status.ttft is not None and status.ttft.count == 12 and status.tpot is None
    assert not status.tpot_is_itl


def test_smg_without_router_counters_counts_client_paths_only():
    metrics = (
        "# TYPE smg_http_requests_total counter\n"
        'smg_http_requests_total{method="GET",path="/readiness"} 90\n'
        'smg_http_requests_total{method="POST",path="/v1/chat/completions"} 5\n'
    )
    answers = RouterAnswers(
        target("smg"),
        got("/health", "OK"),
        got("/readiness", {"status": "ready"}),
        got("/workers", SMG_WORKERS),
        got("/metrics", metrics),
    )
    assert evaluate_router(answers, SLO()).requests_total == 5


def test_without_a_worker_list_or_metrics_the_counts_come_from_pdkits_readiness():
    answers = pdkit_answers(ready=False)
    answers = RouterAnswers(
        answers.target, answers.health, answers.readiness, answers.workers, got("/metrics", "", 404)
    )
    status = evaluate_router(answers, SLO())
    assert status.workers is None
    assert (status.healthy_prefill, status.total_prefill) == (2, 2)
    assert (status.healthy_decode, status.total_decode) == (1, 1)
    assert status.cause == "not ready (/readiness says 503)"


def test_cache_aware_index_per_prefill_is_read_and_shown_under_the_router():
    kv = f"""\
# TYPE pdkit_lb_kv_index_blocks gauge
pdkit_lb_kv_index_blocks{{worker="{P0}"}} 1178.0
pdkit_lb_kv_index_blocks{{worker="{P1}"}} 0.0
# TYPE pdkit_lb_kv_index_live gauge
pdkit_lb_kv_index_live{{worker="{P0}"}} 1.0
pdkit_lb_kv_index_live{{worker="{P1}"}} 0.0
# TYPE pdkit_lb_kv_predictions counter
pdkit_lb_kv_predictions_total{{worker="{P0}"}} 20.0
# TYPE pdkit_lb_kv_predictions_agreed counter
pdkit_lb_kv_predictions_agreed_total{{worker="{P0}"}} 19.0
# TYPE pdkit_lb_kv_hit_rate gauge
pdkit_lb_kv_hit_rate{{worker="{P0}"}} 0.75
"""
    status = evaluate_router(pdkit_answers(metrics=pdkit_metrics() + kv), SLO())
    first, second = status.kv_index
    assert (first.worker, first.blocks, first.live, first.hit_rate) == (P0, 1178, True, 0.75)
    assert (first.predictions, first.agreed) == (20, 19)
    assert not second.live and second.hit_rate is None
    text = router_lines(status).plain
    assert "1,178 blocks  hit rate 75%  predictions agreed 95% (19/20)" in text
    assert "not live: routing without it" in text


def test_the_token_canary_names_the_pair_that_gives_wrong_tokens():
    canary = f"""\
# TYPE pdkit_lb_canary_pair gauge
pdkit_lb_canary_pair{{decode="{D0}",prefill="{P0}",state="ok"}} 1.0
pdkit_lb_canary_pair{{decode="{D0}",prefill="{P1}",state="wrong"}} 1.0
"""
    status = evaluate_router(pdkit_answers(metrics=pdkit_metrics() + canary), SLO())
    assert status.canary_pairs == 2 and status.canary_wrong == ((P1, D0),)
    assert status.problems == (
        f"token canary: prefill {P1} x decode {D0} gives other tokens than the other pairs",
    )
    text = router_lines(status).plain
    p1, d0 = P1.removeprefix("http://"), D0.removeprefix("http://")
    assert f"token canary: prefill {p1} x decode {d0} gives wrong tokens" in text
    agree = canary.replace('state="wrong"', 'state="ok"')
    status = evaluate_router(pdkit_answers(metrics=pdkit_metrics() + agree), SLO())
    assert not status.problems and "token canary: all 2 pairs agree" in router_lines(status).plain


def test_a_router_of_two_processes_counts_each_worker_once_and_lists_its_processes():
    one = pdkit_metrics(requests=20)
    merged = merge_metrics({0: one, 1: one}).decode()
    processes = [
        {"process": i, "pid": 100 + i, "running": True, "inflight": 1, "served": 20}
        for i in range(2)
    ]
    answers = pdkit_answers(metrics=merged)
    body = {**answers.readiness.json(), "processes": processes}
    answers = RouterAnswers(
        answers.target,
        answers.health,
        got("/readiness", body),
        answers.workers,
        answers.metrics,
    )
    status = evaluate_router(answers, SLO())
    assert status.workers is not None and len(status.workers) == 3
    assert (status.healthy_prefill, status.total_prefill) == (2, 2)
    assert status.requests_total == 40  # 20 from each process
    assert [p.pid for p in status.processes] == [100, 101]
    assert "2/2 processes" in router_lines(status).plain
