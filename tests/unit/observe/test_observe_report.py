"""A whole round: the router's view against the probes, problems vs warnings, JSON, the views."""

from __future__ import annotations

import json

from rich.console import Console

from kit.observe.report import build_report, report_to_json
from kit.observe.view import health_lines, status_view
from tests.support.observe_builders import (
    D0,
    P0,
    P1,
    cluster,
    failed,
    ok,
    pdkit_answers,
    pdkit_metrics,
    server_info,
    worker_answers,
)


def report_of(**parts):
    targets, now = cluster(**parts)
    return build_report(targets, now, timeout_s=3.0)


def test_all_healthy_has_no_problem_and_health_says_ok():
    report = report_of()
    assert report.healthy and not report.problems
    assert [w.state for w in report.workers] == ["healthy"] * 3
    # KV transfer failures are shown, but do not make the deployment unhealthy
    assert any("3 KV transfer(s) failed" in str(w) for w in report.warnings)
    lines = health_lines(report)
    assert lines[0] == "OK: demo: 3 workers and the pdkit router are healthy"
    assert all(line.startswith("warning: ") for line in lines[1:])


def test_a_down_worker_the_router_still_routes_to_is_one_problem_line():
    gone = failed("/health", "refused", "connection refused")
    skipped = failed("/x", "skipped", "not asked")
    p1 = worker_answers("prefill", url=P1, instance=1)
    p1 = type(p1)(p1.target, gone, skipped, skipped, skipped)
    report = report_of(p1=p1)
    assert not report.healthy
    assert [str(p) for p in report.problems] == [
        "prefill-1 (10.0.0.1:30001): connection refused; the router still routes to it"
    ]


def test_a_worker_the_router_does_not_list_is_a_problem():
    healthy = {P0: 1, D0: 1}  # P1 never registered
    router = pdkit_answers(metrics=pdkit_metrics(healthy=healthy))
    report = report_of(router=router)
    assert [p.process for p in report.problems] == ["prefill-1"]
    assert "does not list it" in report.problems[0].cause


def test_a_healthy_worker_the_router_ejected_is_a_problem():
    router = pdkit_answers(metrics=pdkit_metrics(healthy={P0: 1, P1: 0, D0: 1}))
    report = report_of(router=router)
    assert report.workers[1].state == "healthy"
    assert report.problems[0].process == "prefill-1"
    assert "the router does not route to it (unhealthy: health_check)" in report.problems[0].cause


def _prefill_1_out(reason: str) -> str:
    """The router's metrics with prefill-1 out of routing for `reason`."""
    metrics = pdkit_metrics(healthy={P0: 1, P1: 0, D0: 1})
    return metrics.replace('reason="health_check"', f'reason="{reason}"')


def test_a_worker_the_router_drains_is_draining():
    report = report_of(router=pdkit_answers(metrics=_prefill_1_out("draining")))
    assert report.workers[1].state == "draining"
    assert "draining" in report.problems[0].cause


def test_a_healthy_worker_the_router_was_just_given_is_joining_not_a_problem():
    report = report_of(router=pdkit_answers(metrics=_prefill_1_out("pending")))
    assert report.workers[1].state == "joining"
    assert "routes to it after its first good health probe" in report.workers[1].cause
    assert report.problems == ()


def test_no_healthy_decode_fails_both_the_decode_and_the_router():
    starting = worker_answers(
        "decode",
        url=D0,
        info=server_info("decode"),
        health=ok("/health", "", 503),
        load={"loads": []},
        metrics="",
    )
    router = pdkit_answers(ready=False, metrics=pdkit_metrics(healthy={P0: 1, P1: 1, D0: 0}))
    report = report_of(d0=starting, router=router)
    lines = [str(p) for p in report.problems]
    assert any(line.startswith("decode-0 (10.0.0.2:30100): starting") for line in lines)
    assert "router (10.0.0.1:8000): not ready: no healthy decode" in lines


def test_the_router_routing_to_something_not_in_the_topology_is_a_warning():
    metrics = pdkit_metrics().replace(
        "# TYPE pdkit_lb_worker_out",
        'pdkit_lb_worker_healthy{worker="http://10.9.9.9:1",role="decode"} 1\n'
        "# TYPE pdkit_lb_worker_out",
    )
    report = report_of(router=pdkit_answers(metrics=metrics))
    assert report.healthy
    assert any(
        "http://10.9.9.9:1 (decode), which is not in the topology" in str(w)
        for w in report.warnings
    )


def test_json_is_plain_data_with_the_verdict_and_the_lines():
    report = report_of(router=pdkit_answers(ready=False))
    data = json.loads(json.dumps(report_to_json(report)))
    assert data["healthy"] is False and data["deployment"] == "demo"
    assert data["router"]["kind"] == "pdkit" and data["router"]["ready"] is False
    assert [w["name"] for w in data["workers"]] == ["prefill-0", "prefill-1", "decode-0"]
    assert data["workers"][0]["kv"]["failed"] == 3
    assert data["problems"][0]["line"].startswith("router (10.0.0.1:8000): not ready")


def test_status_view_has_a_table_per_role_and_the_router_line():
    console = Console(record=True, width=220, color_system=None)
    console.print(status_view(report_of()))
    text = console.export_text()
    assert "prefill (2)" in text and "decode (1)" in text
    assert "boot q" in text and "recv q" in text
    assert "router pdkit 10.0.0.1:8000 healthy  ready  prefill 2/2 healthy  decode 1/1" in text
    assert "TTFT p50/p90/p99 200/" in text
    assert "all healthy" in text and "sim 0.5.23" in text


def test_metrics_from_an_earlier_round_give_windowed_latency_in_watch():
    targets, earlier = cluster(router=pdkit_answers(metrics=pdkit_metrics(requests=10), at=98.0))
    later = pdkit_metrics(requests=30, slow=10)  # 10 first tokens since, all over 400 ms
    _, now = cluster(router=pdkit_answers(metrics=later, at=100.0))
    report = build_report(targets, now, earlier, timeout_s=3.0, latency_over_window=True)
    assert report.router.requests_per_s == 10.0
    assert report.router.rate_window_s == 2.0
    ttft = report.router.ttft
    assert report.router.latency_window == "last round"
    assert ttft is not None and ttft.count == 10 and ttft.within == 0.0
    assert ttft.p50_ms is not None and 400 < ttft.p50_ms <= 800
    assert report.router.slo_met is False  # none of the last round within 400 ms
    since_start = build_report(targets, now, earlier, timeout_s=3.0).router
    assert since_start.latency_window == "since start" and since_start.ttft is not None
    assert since_start.ttft.count == 50


def screen(report, width: int) -> list[str]:
    console = Console(record=True, width=width, color_system=None)
    console.print(status_view(report))
    return console.export_text().splitlines()


def table_of(lines: list[str], role: str) -> tuple[list[str], list[str]]:
    """(header cells, first row cells) of a role's table."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{role} ("))
    header, rows = lines[start + 1], lines[start + 3]
    return header.split("  "), rows.split()


def test_status_fits_the_terminal_keeping_each_roles_key_columns():
    report = report_of()
    for width in (80, 120, 200):
        lines = screen(report, width)
        assert max(len(line) for line in lines) <= width, width
    wide = "\n".join(screen(report, 120))
    for header in ("host:port", "up", "run", "queue", "KV%", "boot q", "send q", "alloc q"):
        assert f" {header} " in f" {wide} ", header
    assert "not shown" not in wide
    narrow = screen(report, 80)
    for role, keys in (
        ("prefill", ("run", "queue", "boot q", "send q", "xfer ms")),
        ("decode", ("run", "queue", "alloc q", "recv q", "KV%")),
    ):
        header = " ".join(table_of(narrow, role)[0])
        assert all(key in header for key in keys), (role, header)
    assert any(line.startswith("  (not shown at 80 columns: ") for line in narrow)
    assert "boot q: waiting for their decode" in " ".join(line.strip() for line in narrow)


def test_every_shown_column_has_a_value_in_every_row():
    for width in (80, 120):
        lines = screen(report_of(), width)
        for role in ("prefill", "decode"):
            header, row = table_of(lines, role)
            cells = [h for h in header if h.strip()]
            assert len(row) >= len(cells), (width, role, header, row)
