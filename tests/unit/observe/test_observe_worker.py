"""One worker judged from its answers: state, cause, identity against the topology, numbers."""

from __future__ import annotations

import pytest

from kit.observe.probe import WorkerAnswers
from kit.observe.worker import evaluate_worker
from tests.support.observe_builders import (
    METRICS,
    NOW,
    failed,
    loads,
    metrics_page,
    ok,
    server_info,
)
from tests.support.observe_builders import worker_answers as answers
from tests.support.observe_builders import worker_target as target


def test_a_healthy_worker_shows_its_load_summed_over_dp_ranks():
    status = evaluate_worker(answers(), NOW)
    assert status.state == "healthy" and not status.problems and status.cause == ""
    assert (status.engine, status.version) == ("sim", "0.5.23")
    assert status.uptime_s == pytest.approx(125)
    assert (status.running, status.queued) == (6, 3)  # /v1/loads wins over /metrics
    assert status.token_usage == pytest.approx(0.35)  # the fullest DP rank
    assert status.gen_throughput == pytest.approx(200.0)
    assert status.pd_queues["bootstrap"] == 3 and status.pd_queues["inflight"] == 4
    assert status.kv.latency_ms == pytest.approx(4.2)  # histogram mean: 42 ms / 10
    assert (status.kv.failed, status.kv.bootstrap_failed, status.kv.transfers) == (3, 1, 10)


def test_without_v1_loads_the_numbers_come_from_metrics():
    status = evaluate_worker(
        WorkerAnswers(
            target(),
            ok("/health", ""),
            ok("/server_info", server_info()),
            ok("/v1/loads?include=all", {"detail": "Not Found"}, 404),
            ok("/metrics", METRICS),
        ),
        NOW,
    )
    assert (status.running, status.queued, status.token_usage) == (9, 2, 0.5)
    assert status.pd_queues["bootstrap"] == 7


@pytest.mark.parametrize(
    ("kind", "detail", "state"),
    [
        ("refused", "connection refused", "down"),
        ("unreachable", "cannot connect: No route to host", "down"),
        ("connect_timeout", "no TCP connection within 3 s (host down?)", "down"),
        ("timeout", "no answer within 3 s", "unhealthy"),
        ("broken", "closed the connection without answering", "unhealthy"),
    ],
)
def test_no_answer_to_health_gives_the_state_and_the_cause(kind, detail, state):
    skipped = failed("/x", "skipped", "not asked")
    status = evaluate_worker(
        WorkerAnswers(target(), failed("/health", kind, detail), skipped, skipped, skipped), NOW
    )
    assert status.state == state and detail in status.cause
    assert status.running is None and status.engine is None


def test_503_while_idle_is_starting_and_503_with_requests_running_is_draining():
    busy = loads()
    starting = evaluate_worker(
        answers(health=ok("/health", "", 503), load={"loads": []}, metrics=""), NOW
    )
    assert starting.state == "starting" and "503" in starting.cause
    draining = evaluate_worker(answers(health=ok("/health", "", 503), load=busy), NOW)
    assert draining.state == "draining" and "still run" in draining.cause


def test_other_health_statuses_are_unhealthy():
    status = evaluate_worker(answers(health=ok("/health", "boom", 500)), NOW)
    assert status.state == "unhealthy" and status.cause == "/health answered HTTP 500"


@pytest.mark.parametrize(
    ("change", "expected_text"),
    [
        ({"served_model_name": "qwen3-8b"}, "serves model 'qwen3-8b', the topology expects"),
        ({"disaggregation_mode": "decode"}, "disaggregation mode 'decode'"),
        ({"engine": None, "version": "0.5.23"}, "is engine 'sglang', the topology expects 'sim'"),
        ({"version": "0.5.9"}, "runs SGLang 0.5.9, the topology expects 0.5.23"),
        ({"disaggregation_bootstrap_port": 9000}, "has bootstrap port 9000"),
        ({"tp_size": 2}, "runs with tp_size 2"),
    ],
)
def test_a_server_that_is_not_what_the_topology_expects_is_unhealthy(change, expected_text):
    info = {k: v for k, v in server_info(**change).items() if v is not None}
    status = evaluate_worker(answers(info=info), NOW)
    assert status.state == "unhealthy"
    assert status.cause.startswith("not what the topology expects: ")
    assert expected_text in status.cause


def test_every_mismatch_is_listed():
    status = evaluate_worker(
        answers(info=server_info(served_model_name="other", disaggregation_mode="decode")), NOW
    )
    assert len(status.problems) == 2


def test_a_starting_worker_serving_another_model_is_unhealthy_with_both_causes():
    status = evaluate_worker(
        answers(health=ok("/health", "", 503), info=server_info(served_model_name="x"), metrics=""),
        NOW,
    )
    assert status.state == "unhealthy"
    assert any("serves model 'x'" in p for p in status.problems)
    assert any("503" in p for p in status.problems)


def test_an_http_server_without_server_info_is_not_taken_for_sglang():
    status = evaluate_worker(
        WorkerAnswers(
            target(),
            ok("/health", ""),
            ok("/server_info", "Not Found", 404),
            ok("/v1/loads?include=all", "Not Found", 404),
            ok("/metrics", "Not Found", 404),
        ),
        NOW,
    )
    assert status.state == "unhealthy" and "not an SGLang server" in status.cause


def test_metrics_switched_off_is_a_note_not_a_problem():
    status = evaluate_worker(answers(metrics=ok("/metrics", "Not Found", 404)), NOW)
    assert status.state == "healthy"
    assert any("--enable-metrics" in n for n in status.notes)
    assert status.kv.failed is None and status.kv.latency_ms == pytest.approx(5.0)  # /v1/loads


def test_a_fresh_decode_page_without_the_families_read_counts_no_failure():
    # Real SGLang 0.5.23's decode before its scheduler logs a batch: hundreds of sglang: lines,
    # none of the counters status reads; absent labelled counters are 0, not unknown.
    page = "# HELP sglang:cache_hit_rate x\n# TYPE sglang:cache_hit_rate gauge\n"
    page += 'sglang:cache_hit_rate{model_name="m"} 0.0\n'
    status = evaluate_worker(answers("decode", metrics=page), NOW)
    assert (status.kv.failed, status.kv.bootstrap_failed) == (0, 0)


def test_metrics_that_time_out_leave_a_note():
    page = failed("/metrics", "timeout", "no answer within 3 s")
    status = evaluate_worker(answers(metrics=page), NOW)
    assert status.kv.failed is None
    assert "/metrics: no answer within 3 s" in status.notes


def test_a_real_sglang_server_info_is_read_for_version_and_engine():
    info = server_info(startup_time={"load_weight": 12.5, "cuda_graph": {}})
    del info["engine"], info["sim"]
    status = evaluate_worker(answers(info=info, engine="sglang"), NOW)
    assert status.state == "healthy" and (status.engine, status.version) == ("sglang", "0.5.23")
    assert status.uptime_s is None  # SGLang's startup_time holds durations, not a time
    started = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %s\n"
    with_process = evaluate_worker(
        answers(info=info, metrics=METRICS + started % (NOW - 40), engine="sglang"), NOW
    )
    assert with_process.uptime_s == pytest.approx(40)  # from process metrics when exported


def test_the_sims_uptime_is_from_its_start_time_not_sglangs_startup_phases():
    info = server_info(startup_time={"load_weight": 4.0, "scheduler_e2e": 9.0, "cuda_graph": {}})
    assert evaluate_worker(answers(info=info), NOW).uptime_s == pytest.approx(125)
    info["sim"] = {"started_at": NOW + 5}  # a clock ahead of ours: no negative uptime
    assert evaluate_worker(answers(info=info), NOW).uptime_s == 0


def test_kv_latency_exposed_as_a_gauge_is_the_last_transfer():
    gauge = (
        "# TYPE sglang:kv_transfer_latency_ms gauge\n"
        'sglang:kv_transfer_latency_ms{tp_rank="0",dp_rank="0"} 3.5\n'
    )
    status = evaluate_worker(answers(metrics=gauge), NOW)
    assert status.kv.latency_ms == 3.5 and status.kv.window == "latest"
    never = evaluate_worker(answers(metrics=gauge.replace("3.5", "0.0"), load={"loads": []}), NOW)
    assert never.kv.latency_ms is None


def test_watch_shows_kv_latency_over_the_last_round():
    earlier = answers(metrics=metrics_page(transfers=10, total_ms=42.0))
    later = answers(metrics=metrics_page(transfers=12, total_ms=62.0))
    status = evaluate_worker(later, NOW, earlier)
    assert status.kv.window == "last round" and status.kv.latency_ms == pytest.approx(10.0)
    quiet = evaluate_worker(earlier, NOW, earlier)  # nothing moved: the mean since start
    assert quiet.kv.window == "since start" and quiet.kv.latency_ms == pytest.approx(4.2)
