"""The Grafana dashboard of a PD deployment (`pdkit dashboard > pd.json`, then import it).

Every panel queries the Prometheus that `monitoring:` deploys, by the names SGLang 0.5.23
exports on each worker (the sim exports the same), pdkit's router (`pdkit_lb_*`) and smg 1.13
(`smg_*`): a router panel asks for both routers' series with `or`, so one dashboard serves
either kind. The scrape configuration gives every series `deployment`, `process` and `job`
(router, prefill, decode), which the panels group by.

Counters that only appear once something happened (failures, retries, admission refusals)
fall back to `0 * <a series the target always has>`, so a healthy deployment shows 0, not "No
data", while a deployment whose metrics are missing still shows nothing.

Variables: the data source, the deployment, and the SLO thresholds as histogram bucket bounds
(`le`) that both SGLang's and the routers' histograms have; with a topology, their defaults
are its name and its `slo:` (the largest common bound at or below it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kit.topology.plan_types import Plan

TTFT_BOUNDS = ("0.1", "0.2", "0.4", "0.8")
"""TTFT bucket bounds (s) of both SGLang's and pdkit's router's TTFT histograms."""
TPOT_BOUNDS = ("0.01", "0.02", "0.04", "0.06", "0.08", "0.1")
"""Inter-token bucket bounds (s) of both SGLang's and pdkit's router's ITL histograms."""
QUANTILES = ("0.5", "0.9", "0.99")

D = 'deployment="$deployment"'
WORKERS = f'{D}, job=~"prefill|decode"'
RATE = "$__rate_interval"
CLIENT_ROUTES = 'route=~"/generate|/v1/completions|/v1/chat/completions"'


def rate(metric: str, selector: str = D, by: str = "") -> str:
    """`sum [by (...)] (rate(metric{selector}[$__rate_interval]))`."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{selector}}}[{RATE}]))"


def quantile(q: str, metric: str, selector: str = D, by: str = "") -> str:
    """`histogram_quantile` of a histogram family (without `_bucket`) over the rate window."""
    grouping = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, {rate(f'{metric}_bucket', selector, grouping)})"


def per_worker(metric: str, job: str, aggregate: str = "sum") -> str:
    """A worker gauge per process of a role (`job`): summed (or `aggregate`d) over DP ranks."""
    return f'{aggregate} by (process) ({metric}{{{D}, job="{job}"}})'


def zero_for(by: str, selector: str = WORKERS) -> str:
    """0 for every worker (grouped `by`): what a counter that never moved is worth."""
    return f"0 * sum by ({by}) (sglang:num_running_reqs{{{selector}}})"


def share_within(metric: str, bound_variable: str, selector: str = D) -> str:
    """Share (0..1) of a histogram's observations at or below `$bound_variable`."""
    within = rate(f"{metric}_bucket", f'{selector}, le="${bound_variable}"')
    return f"{within} / {rate(f'{metric}_count', selector)}"


@dataclass(frozen=True)
class Query:
    """One PromQL expression and the legend of its series (Grafana `{{label}}` syntax)."""

    expr: str
    legend: str


def percentiles(label: str, expr: Callable[[str], str]) -> tuple[Query, ...]:
    """p50, p90 and p99 of one histogram: `expr(q)` is the query of quantile q."""
    return tuple(Query(expr(q), f"{label} p{float(q) * 100:g}") for q in QUANTILES)


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    width: int = 12


DECODE = f'{D}, job="decode"'
ROUTER_REQUESTS = (
    f"{rate('pdkit_lb_requests_total', f'{D}, {CLIENT_ROUTES}', 'status')}"
    f" or {rate('smg_http_responses_total', D, 'status_code')}"
)
# The SLO is judged on the decode workers: in PD the router sends a request to its prefill
# and its decode at once, so the decode's TTFT runs from (about) the client's send, and its
# TPOT is per request. Their buckets have the bounds the variables offer (the routers' may not).
DECODE_TTFT_WITHIN = rate("sglang:time_to_first_token_seconds_bucket", f'{DECODE}, le="$ttft_le"')
DECODE_TTFT_SHARE = share_within("sglang:time_to_first_token_seconds", "ttft_le", DECODE)
DECODE_TPOT_SHARE = share_within("sglang:request_time_per_output_token_seconds", "tpot_le", DECODE)
ROUTER_ITL_SHARE = share_within("pdkit_lb_inter_token_latency_seconds", "tpot_le")


def _panels() -> tuple[tuple[str, tuple[Panel, ...]], ...]:
    """The dashboard's rows and their panels, top to bottom."""
    service = (
        Panel(
            "Goodput (req/s within the SLO, upper bound)",
            "Requests per second whose TTFT met the SLO, times the share whose TPOT met it "
            "(both on the decode workers). The two shares are counted apart, so this is an "
            "upper bound of the requests that met both.",
            "reqps",
            (
                Query(f"{DECODE_TTFT_WITHIN} * on() ({DECODE_TPOT_SHARE})", "goodput"),
                Query(rate("sglang:e2e_request_latency_seconds_count", DECODE), "finished"),
            ),
        ),
        Panel(
            "SLO attainment",
            "Share of requests with TTFT <= $ttft_le s and with TPOT <= $tpot_le s (decode "
            "workers), and of pdkit's router's token gaps <= $tpot_le s. The topology's "
            "slo.attainment is the target.",
            "percentunit",
            (
                Query(DECODE_TTFT_SHARE, "TTFT <= $ttft_le s"),
                Query(DECODE_TPOT_SHARE, "TPOT <= $tpot_le s"),
                Query(
                    f"({ROUTER_ITL_SHARE}) or 0 * sum(smg_worker_pool_size{{{D}}})",
                    "router token gaps <= $tpot_le s",
                ),
            ),
        ),
        Panel(
            "Requests by status",
            "Client requests per second through the router, by HTTP status.",
            "reqps",
            (Query(ROUTER_REQUESTS, "{{status}}{{status_code}}"),),
        ),
        Panel(
            "Errors by cause",
            "Failed requests per second, by the router's cause (pdkit) or status (smg).",
            "reqps",
            (
                Query(
                    f"{rate('pdkit_lb_errors_total', D, 'cause')}"
                    f" or {rate('smg_router_request_errors_total', D, 'error_type')}"
                    f" or 0 * sum({ROUTER_REQUESTS})",
                    "{{cause}}{{error_type}}",
                ),
            ),
        ),
    )
    latency = (
        Panel(
            "TTFT per role",
            "Time to first token: the router's (what clients see), and each role's own "
            "(prefill: until its one token; decode: from its arrival).",
            "s",
            (
                *percentiles(
                    "router",
                    lambda q: (
                        f"{quantile(q, 'pdkit_lb_time_to_first_token_seconds')}"
                        f" or {quantile(q, 'smg_router_ttft_seconds')}"
                        f" or {quantile(q, 'smg_pd_ttft_seconds')}"
                    ),
                ),
                Query(
                    quantile("0.9", "sglang:time_to_first_token_seconds", WORKERS, "job"),
                    "{{job}} p90",
                ),
            ),
        ),
        Panel(
            "TPOT per role",
            "Time per output token on the decode workers (per request), and the router's "
            "inter-token gaps (pdkit) or TPOT (smg).",
            "s",
            (
                *percentiles(
                    "decode",
                    lambda q: quantile(q, "sglang:request_time_per_output_token_seconds", DECODE),
                ),
                Query(
                    f"{quantile('0.9', 'pdkit_lb_inter_token_latency_seconds')}"
                    f" or {quantile('0.9', 'smg_router_tpot_seconds')}",
                    "router p90",
                ),
            ),
        ),
    )
    queues = (
        Panel(
            "Prefill queues",
            "Requests waiting on each prefill: for the scheduler (queued), for their decode's "
            "reservation (bootstrap) and for their KV transfer to finish (in flight).",
            "short",
            (
                Query(
                    per_worker("sglang:num_queue_reqs", "prefill"),
                    "{{process}} queued",
                ),
                Query(
                    per_worker("sglang:num_prefill_bootstrap_queue_reqs", "prefill"),
                    "{{process}} bootstrap",
                ),
                Query(
                    per_worker("sglang:num_prefill_inflight_queue_reqs", "prefill"),
                    "{{process}} in flight",
                ),
            ),
        ),
        Panel(
            "Decode queues",
            "Requests waiting on each decode: for KV room (prealloc), for their KV to arrive "
            "(transfer) and for the scheduler (queued).",
            "short",
            (
                Query(
                    per_worker("sglang:num_decode_prealloc_queue_reqs", "decode"),
                    "{{process}} prealloc",
                ),
                Query(
                    per_worker("sglang:num_decode_transfer_queue_reqs", "decode"),
                    "{{process}} transfer",
                ),
                Query(
                    per_worker("sglang:num_queue_reqs", "decode"),
                    "{{process}} queued",
                ),
            ),
        ),
        Panel(
            "Running requests per worker",
            "Requests each worker is running now (summed over its DP ranks).",
            "short",
            (Query(f"sum by (process) (sglang:num_running_reqs{{{WORKERS}}})", "{{process}}"),),
        ),
        Panel(
            "KV cache use per worker",
            "Share of the KV cache in use (the fullest DP rank).",
            "percentunit",
            (Query(f"max by (process) (sglang:token_usage{{{WORKERS}}})", "{{process}}"),),
        ),
        Panel(
            "Generation throughput per worker",
            "Tokens generated per second.",
            "short",
            (Query(f"sum by (process) (sglang:gen_throughput{{{WORKERS}}})", "{{process}}"),),
        ),
        Panel(
            "Router load per worker",
            "Requests in flight on each worker as the router counts them (pdkit) or active "
            "requests (smg).",
            "short",
            (
                Query(
                    f"sum by (worker, role) (pdkit_lb_worker_inflight{{{D}}})"
                    f" or sum by (worker) (smg_worker_requests_active{{{D}}})",
                    "{{role}} {{worker}}",
                ),
            ),
        ),
        Panel(
            "Prefix cache index per prefill (cache_aware)",
            "Blocks pdkit's router holds from each prefill's KV events, and the share of "
            "prompt tokens it predicted cached there. 0 unless prefill_policy is cache_aware.",
            "short",
            (
                Query(
                    f"sum by (worker) (pdkit_lb_kv_index_blocks{{{D}}})"
                    f" or 0 * sum({ROUTER_REQUESTS})",
                    "blocks {{worker}}",
                ),
                Query(
                    f"max by (worker) (pdkit_lb_kv_hit_rate{{{D}}}) or 0 * sum({ROUTER_REQUESTS})",
                    "hit rate {{worker}}",
                ),
            ),
        ),
    )
    transfer = (
        Panel(
            "KV transfer latency",
            "How long each prefill takes to send a request's KV cache (p50, p90).",
            "ms",
            tuple(
                Query(
                    quantile(q, "sglang:kv_transfer_latency_ms", WORKERS, "process"),
                    f"{{{{process}}}} p{float(q) * 100:g}",
                )
                for q in QUANTILES[:2]
            ),
        ),
        Panel(
            "KV transfer bandwidth",
            "KV cache megabytes sent per second by each prefill, and the mean speed of one "
            "transfer (GB/s).",
            "MBs",
            (
                Query(
                    rate("sglang:kv_transfer_total_mb_sum", WORKERS, "process"),
                    "{{process}} MB/s",
                ),
                Query(
                    f"{rate('sglang:kv_transfer_speed_gb_s_sum', WORKERS, 'process')}"
                    f" / {rate('sglang:kv_transfer_speed_gb_s_count', WORKERS, 'process')}"
                    " * 1000",
                    "{{process}} per transfer",
                ),
            ),
        ),
        Panel(
            "KV transfer and bootstrap failures",
            "Requests per second whose KV transfer or bootstrap failed, per worker.",
            "reqps",
            (
                Query(
                    f"{rate('sglang:num_transfer_failed_reqs_total', WORKERS, 'process')}"
                    f" or {zero_for('process')}",
                    "{{process}} transfer",
                ),
                Query(
                    f"{rate('sglang:num_bootstrap_failed_reqs_total', WORKERS, 'process')}"
                    f" or {zero_for('process')}",
                    "{{process}} bootstrap",
                ),
            ),
        ),
    )
    router = (
        Panel(
            "Router admission",
            "Requests per second pdkit's router admitted and refused (429, by the SLO it "
            "predicted missed: router.args admission), smg's admission waits and sheds, and "
            "retries on another worker. 0 while admission is off.",
            "reqps",
            (
                Query(
                    f"{rate('pdkit_lb_admitted_total', D)}"
                    f" or {rate('smg_pd_admission_waits_total', D)}"
                    f" or 0 * sum({ROUTER_REQUESTS})",
                    "admitted",
                ),
                Query(
                    f"{rate('pdkit_lb_rejected_total', D, 'reason')}"
                    f" or {rate('smg_pd_admission_sheds_total', D)}"
                    f" or 0 * sum({ROUTER_REQUESTS})",
                    "refused {{reason}}",
                ),
                Query(
                    f"{rate('pdkit_lb_retries_total', D, 'role')}"
                    f" or {rate('smg_router_upstream_send_retries_total', D)}"
                    f" or 0 * sum({ROUTER_REQUESTS})",
                    "retries {{role}}",
                ),
            ),
        ),
        Panel(
            "Admission model (pdkit router)",
            "What pdkit's admission predicts from: prompt tokens queued ahead on each prefill, "
            "and how far observed TTFT and TPOT were from its predictions (1 = exact).",
            "short",
            (
                Query(
                    f"sum by (worker) (pdkit_lb_admission_prefill_queue_tokens{{{D}}})",
                    "queued tokens {{worker}}",
                ),
                *percentiles(
                    "TTFT observed/predicted",
                    lambda q: quantile(q, "pdkit_lb_admission_ttft_error_ratio"),
                )[:2],
                Query(
                    quantile("0.9", "pdkit_lb_admission_tpot_error_ratio"),
                    "TPOT observed/predicted p90",
                ),
            ),
        ),
        Panel(
            "Workers the router routes to",
            "1 while the router considers a worker routable.",
            "short",
            (
                Query(
                    f"sum by (worker, role) (pdkit_lb_worker_healthy{{{D}}})"
                    f" or sum by (worker) (smg_worker_health{{{D}}})",
                    "{{role}} {{worker}}",
                ),
            ),
        ),
        Panel(
            "Scrape targets up",
            "1 while Prometheus can scrape a process of the deployment.",
            "short",
            (Query(f"up{{{D}}}", "{{job}} {{process}}"),),
        ),
    )
    return (
        ("Service level", service),
        ("Latency", latency),
        ("Load, queues and KV cache", queues),
        ("KV transfer", transfer),
        ("Router", router),
    )


def _bound_at_or_below(limit_s: float, bounds: tuple[str, ...]) -> str:
    fitting = [b for b in bounds if float(b) <= limit_s + 1e-9]
    return fitting[-1] if fitting else bounds[0]


def _custom(name: str, label: str, options: tuple[str, ...], current: str) -> dict[str, Any]:
    return {
        "type": "custom",
        "name": name,
        "label": label,
        "query": ",".join(options),
        "current": {"text": current, "value": current},
        "options": [{"text": o, "value": o, "selected": o == current} for o in options],
    }


def _grafana_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": q.expr,
                "legendFormat": q.legend,
            }
            for i, q in enumerate(panel.queries)
        ],
    }


def dashboard(plan: Plan | None = None) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model; `plan` sets the variables' defaults."""
    deployment = plan.name if plan else ""
    ttft = _bound_at_or_below(plan.slo.ttft_ms / 1000, TTFT_BOUNDS) if plan else "0.4"
    tpot = _bound_at_or_below(plan.slo.tpot_ms / 1000, TPOT_BOUNDS) if plan else "0.04"
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in _panels():
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_grafana_panel(panel, len(panels) + 1, x, y))
            x += panel.width
        y += 8
    return {
        "title": f"pdkit PD deployment{f' {deployment}' if deployment else ''}",
        "uid": f"pdkit-{deployment}"[:40] if deployment else "pdkit-pd",
        "description": "SGLang prefill/decode disaggregation: service level, latency per role, "
        "queues, KV cache and KV transfer, router. Generated by `pdkit dashboard`.",
        "tags": ["pdkit", "sglang", "pd-disaggregation"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Prometheus",
                    "query": "prometheus",
                },
                {
                    "type": "query",
                    "name": "deployment",
                    "label": "deployment",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": {"query": 'label_values(up{job="router"}, deployment)'},
                    "definition": 'label_values(up{job="router"}, deployment)',
                    "refresh": 1,
                    "current": {"text": deployment, "value": deployment} if deployment else {},
                },
                _custom("ttft_le", "TTFT SLO (s)", TTFT_BOUNDS, ttft),
                _custom("tpot_le", "TPOT SLO (s)", TPOT_BOUNDS, tpot),
            ]
        },
        "panels": panels,
    }


def dashboard_json(plan: Plan | None = None) -> str:
    """The dashboard as the JSON text Grafana imports."""
    return json.dumps(dashboard(plan), indent=2) + "\n"


def panel_queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query in a dashboard's JSON model."""
    return [
        (panel["title"], target["expr"])
        for panel in model["panels"]
        if panel.get("type") != "row"
        for target in panel.get("targets", [])
    ]


def substitute(
    expr: str, deployment: str, rate_interval: str, ttft_le: str = "0.4", tpot_le: str = "0.04"
) -> str:
    """A panel's query as Grafana sends it, its variables filled in (for tests and scripts)."""
    values = {
        "$deployment": deployment,
        "$__rate_interval": rate_interval,
        "$ttft_le": ttft_le,
        "$tpot_le": tpot_le,
    }
    for name, value in values.items():
        expr = expr.replace(name, value)
    return expr
