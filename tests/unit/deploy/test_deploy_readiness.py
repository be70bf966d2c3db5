"""Readiness verdicts: pure functions over an HTTP answer and the service manager's view."""

from __future__ import annotations

from kit.deploy.readiness import (
    HttpAnswer,
    ServiceInfo,
    Verdict,
    evaluate,
    evaluate_service,
    follow_rank0,
    timed_out,
)
from kit.deploy.services import systemd_info

SINCE = 1000.0


def service(state="RUNNING", *, stop=0.0, exit_status=0, description="pid 7, uptime 0:00:03"):
    return ServiceInfo("decode-0", state, 7, 900.0, stop, exit_status, description)


def test_health_200_is_ready():
    assert evaluate(HttpAnswer(200), service(), ready_path="/health", since=SINCE).state == "ready"


def test_503_is_starting_and_refused_is_waiting():
    assert evaluate(HttpAnswer(503), None, ready_path="/health", since=SINCE).state == "starting"
    refused = HttpAnswer(None, "connection refused")
    verdict = evaluate(refused, None, ready_path="/health", since=SINCE)
    assert verdict == Verdict("waiting", "no answer yet (connection refused)")


def test_refused_while_the_process_runs_is_starting():
    verdict = evaluate(
        HttpAnswer(None, "refused"), service("STARTING"), ready_path="/health", since=SINCE
    )
    assert verdict.state == "starting"
    assert "pid 7" in verdict.detail


def test_a_fatal_process_has_failed_even_if_something_answers_on_its_port():
    verdict = evaluate(
        HttpAnswer(200),
        service("FATAL", exit_status=1, description="Exited too quickly"),
        ready_path="/health",
        since=SINCE,
    )
    assert verdict.state == "failed"
    assert "exited during startup" in verdict.detail
    assert "FATAL" in verdict.detail
    assert "exit status 1" in verdict.detail


def test_backoff_means_it_exited_during_startup():
    verdict = evaluate(
        HttpAnswer(None, "refused"),
        service("BACKOFF", exit_status=1),
        ready_path="/health",
        since=SINCE,
    )
    assert verdict.state == "failed"


def test_a_crash_after_the_rollout_is_a_failure_even_once_restarted():
    crashed = service("RUNNING", stop=SINCE + 5, exit_status=-9)
    assert evaluate(HttpAnswer(503), crashed, ready_path="/health", since=SINCE).state == "failed"
    restarted_by_pdkit = service("RUNNING", stop=SINCE - 5)
    assert (
        evaluate(HttpAnswer(200), restarted_by_pdkit, ready_path="/health", since=SINCE).state
        == "ready"
    )


def test_unauthorized_router_is_a_failure_not_a_wait():
    verdict = evaluate(HttpAnswer(401), None, ready_path="/readiness", since=SINCE)
    assert verdict.state == "failed"
    assert "API key" in verdict.detail


def test_non_http_nodes_follow_rank0_unless_they_failed():
    own = evaluate(None, service(), ready_path="/health", since=SINCE)
    assert follow_rank0(own, Verdict("ready", "/health 200")).state == "ready"
    failed = Verdict("failed", "exited")
    assert follow_rank0(failed, Verdict("ready", "")).state == "failed"


def test_timeout_applies_only_to_unsettled_verdicts():
    starting = Verdict("starting", "/health 503 (loading)")
    assert timed_out(starting, 5, 10) == starting
    late = timed_out(starting, 10, 10)
    assert late.state == "timeout"
    assert "503" in late.detail
    assert timed_out(Verdict("ready", ""), 99, 10).state == "ready"


def test_systemd_restarts_since_the_rollout_fail_a_running_unit_older_ones_do_not():
    props = {
        "Id": "u",
        "ActiveState": "active",
        "SubState": "running",
        "Result": "success",
        "NRestarts": "2",
        "ExecMainPID": "77",
        "ExecMainStatus": "0",
        "ExecMainStartTimestamp": "@1000",
        "ExecMainExitTimestamp": "@999",
    }
    restarted = evaluate_service(systemd_info("decode-0", props), since=900)
    assert restarted is not None and restarted.state == "failed"
    assert restarted.detail == "exited (exit status 0) and systemd started it again (2 restart(s))"
    # Restarted before this rollout (pdkit's own start resets NRestarts): not this run's crash.
    assert evaluate_service(systemd_info("decode-0", props), since=1500) is None
    backoff = evaluate_service(
        systemd_info(
            "decode-0",
            {
                **props,
                "ActiveState": "activating",
                "SubState": "auto-restart",
                "ExecMainStatus": "1",
            },
        ),
        since=900,
    )
    assert backoff is not None
    assert backoff.detail == (
        "exited during startup (systemd activating/auto-restart: it exited and systemd restarts "
        "it (2 restart(s) so far), exit status 1)"
    )
