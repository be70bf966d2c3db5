"""Judge the router from its answers: pure, no I/O (`evaluate_router(answers, ...) -> status`).

Both router kinds answer `/health` (liveness) and `/readiness` (200 only with at least one
healthy prefill and one healthy decode). The worker list comes from `/workers` (smg; pdkit's
load balancer when an admin key is configured), else from the `/readiness` body, else from the
per-worker gauges in the metrics. Metric names differ per kind (see `METRIC_NAMES`):

    pdkit  pdkit_lb_requests_total, pdkit_lb_time_to_first_token_seconds (TTFT),
           pdkit_lb_inter_token_latency_seconds (TPOT)
    smg    smg_router_requests_total, smg_router_ttft_seconds, smg_router_tpot_seconds

pdkit's load balancer measures TPOT as the gap between streamed events (inter-token latency),
so its SLO share there is a share of token gaps; smg's is per request.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kit.errors import ProbeError
from kit.observe.probe import Fetched, RouterAnswers
from kit.observe.prom import Histogram, MetricSet, parse_metrics, rate
from kit.observe.worker import State
from kit.topology.schema import SLO

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class MetricNames:
    requests: tuple[str, ...]
    ttft: tuple[str, ...]
    tpot: tuple[str, ...]
    tpot_is_itl: bool


METRIC_NAMES = {
    "pdkit": MetricNames(
        requests=("pdkit_lb_requests_total",),
        ttft=("pdkit_lb_time_to_first_token_seconds",),
        tpot=("pdkit_lb_inter_token_latency_seconds",),
        tpot_is_itl=True,
    ),
    "smg": MetricNames(
        requests=("smg_router_requests_total",),
        # In PD mode over HTTP smg 1.13 times TTFT as smg_pd_ttft_seconds and has no TPOT.
        ttft=("smg_router_ttft_seconds", "smg_pd_ttft_seconds"),
        tpot=("smg_router_tpot_seconds",),
        tpot_is_itl=False,
    ),
}
LB_GAUGES = (
    "pdkit_lb_worker_healthy",
    "pdkit_lb_worker_out",
    "pdkit_lb_inflight_requests",
    "pdkit_lb_draining",
    "smg_http_requests_total",
)
KV_INDEX_FAMILIES = (
    "pdkit_lb_kv_index_blocks",
    "pdkit_lb_kv_index_live",
    "pdkit_lb_kv_predictions_total",
    "pdkit_lb_kv_predictions_agreed_total",
    "pdkit_lb_kv_hit_rate",
)
"""cache_aware's KV-event index, per prefill (kit.lb.metrics)."""
CANARY_PAIR = "pdkit_lb_canary_pair"
"""The token canary's state of each pair in its last round (kit.lb.canary)."""
FAMILIES = frozenset(
    {n for names in METRIC_NAMES.values() for n in (*names.requests, *names.ttft, *names.tpot)}
    | set(LB_GAUGES)
    | set(KV_INDEX_FAMILIES)
    | {CANARY_PAIR}
)
"""The router metric families status reads."""
# smg counts every HTTP request in smg_http_requests_total, the probes included.
# pdkit's load balancer labels every route it serves; these are the PD-dispatched ones.
PDKIT_CLIENT_ROUTES = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
_NOT_CLIENT_PATHS = frozenset(
    {"/health", "/liveness", "/readiness", "/workers", "/metrics", "/health_generate", "/"}
)


@dataclass(frozen=True)
class RoutedWorker:
    """A worker as the router sees it."""

    url: str
    role: str
    healthy: bool
    state: str
    reason: str | None = None


@dataclass(frozen=True)
class Latency:
    """Percentiles (ms) of a router latency histogram over `count` observations, and the share
    (0..1) of them at or below `limit_ms` (the topology's SLO)."""

    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    count: int
    limit_ms: float
    within: float | None


@dataclass(frozen=True)
class KvIndexView:
    """What pdkit's router knows of one prefill's cache from its KV events (cache_aware)."""

    worker: str
    blocks: int
    live: bool
    hit_rate: float | None  # predicted cached tokens / prompt tokens routed there
    predictions: int
    agreed: int  # predictions equal to the prefill's own cached_tokens


@dataclass(frozen=True)
class RouterProcessView:
    """One of pdkit's router processes (`router.processes` > 1), from its /readiness body."""

    index: int
    pid: int
    running: bool
    inflight: int
    served: int


@dataclass(frozen=True)
class RouterStatus:
    """Everything status shows about the router; None when unknown.

    `requests_per_s` is client requests per second over `rate_window_s` seconds; latency
    figures cover `latency_window` ("since start" or the last round).
    """

    name: str
    kind: str
    endpoint: str
    state: State
    cause: str = ""
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    ready: bool | None = None
    workers: tuple[RoutedWorker, ...] | None = None
    healthy_prefill: int | None = None
    healthy_decode: int | None = None
    total_prefill: int | None = None
    total_decode: int | None = None
    requests_total: int | None = None
    requests_per_s: float | None = None
    rate_window_s: float | None = None
    inflight: int | None = None
    ttft: Latency | None = None
    tpot: Latency | None = None
    tpot_is_itl: bool = False
    latency_window: str = "since start"
    slo_attainment: float = 0.9
    slo_met: bool | None = None
    kv_index: tuple[KvIndexView, ...] = ()
    canary_pairs: int = 0  # pairs the token canary checked in its last round (0: off or none yet)
    canary_wrong: tuple[tuple[str, str], ...] = ()  # (prefill URL, decode URL) with wrong tokens
    processes: tuple[RouterProcessView, ...] = ()


def _canary_wrong(metrics: MetricSet) -> tuple[int, tuple[tuple[str, str], ...]]:
    """(pairs checked, the wrong ones) from the token canary's last round."""
    samples = [s for s in metrics.samples(CANARY_PAIR) if s.value > 0]
    wrong = sorted(
        (s.labels.get("prefill", ""), s.labels.get("decode", ""))
        for s in samples
        if s.labels.get("state") == "wrong"
    )
    return len(samples), tuple(wrong)


def _processes(readiness: Any) -> tuple[RouterProcessView, ...]:
    """pdkit's router processes from its /readiness body (none for one process)."""
    items = readiness.get("processes") if isinstance(readiness, dict) else None
    if not isinstance(items, list):
        return ()
    return tuple(
        RouterProcessView(
            index=_count(item.get("process")) or 0,
            pid=_count(item.get("pid")) or 0,
            running=item.get("running") is True,
            inflight=_count(item.get("inflight")) or 0,
            served=_count(item.get("served")) or 0,
        )
        for item in items
        if isinstance(item, dict)
    )


def _routed_workers(body: Any) -> tuple[RoutedWorker, ...] | None:
    """Normalise smg's and pdkit's worker lists (`{"workers": [...]}` or a bare list)."""
    items = body.get("workers") if isinstance(body, dict) else body
    if not isinstance(items, list):
        return None
    found = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        role = str(item.get("role") or item.get("worker_type") or "?")
        if isinstance(item.get("is_healthy"), bool):  # smg: is_healthy, and status "failed"...
            healthy = bool(item["is_healthy"])
            state = "healthy" if healthy else str(item.get("status") or "unhealthy")
        else:
            state = str(item.get("state") or "?")
            healthy = state == "healthy"
        reason = item.get("reason")
        found.append(
            RoutedWorker(
                url=item["url"].rstrip("/"),
                role=role,
                healthy=healthy,
                state=state,
                reason=str(reason) if reason else None,
            )
        )
    return tuple(found)


def _workers_from_metrics(metrics: MetricSet, readiness: Any) -> tuple[RoutedWorker, ...] | None:
    """pdkit's per-worker gauge pdkit_lb_worker_healthy (every worker), with the state and
    reason of the ones that are out taken from its /readiness body (`out`)."""
    healthy = metrics.samples("pdkit_lb_worker_healthy")
    if not healthy:
        return None
    out: dict[str, RoutedWorker] = {}
    listed = readiness.get("out") if isinstance(readiness, dict) else None
    for view in _routed_workers({"workers": listed}) or ():
        out[view.url] = view
    reasons = {
        s.labels.get("worker", "").rstrip("/"): s.labels.get("reason", "out")
        for s in metrics.samples("pdkit_lb_worker_out")
        if s.value > 0
    }
    # One sample per worker, or one per worker and router process (label `process`): a
    # worker out in any process is shown out.
    found: dict[str, RoutedWorker] = {}
    for sample in healthy:
        url = sample.labels.get("worker", "").rstrip("/")
        role = sample.labels.get("role", "?")
        if sample.value > 0:
            found.setdefault(url, RoutedWorker(url, role, True, "healthy"))
        elif url in out:
            found[url] = dataclasses.replace(out[url], role=role, healthy=False)
        else:
            reason = reasons.get(url)
            found[url] = RoutedWorker(url, role, False, _out_state(reason), reason)
    return tuple(found.values())


def _role_counts(
    role: str, workers: tuple[RoutedWorker, ...] | None, readiness: Any
) -> tuple[int | None, int | None]:
    """(healthy, total) workers of a role: from the worker list, else from pdkit's /readiness
    body (`{"prefill": {"healthy": 2, "total": 2}, ...}`)."""
    if workers is not None:
        mine = [w for w in workers if w.role == role]
        return sum(w.healthy for w in mine), len(mine)
    said = readiness.get(role) if isinstance(readiness, dict) else None
    if isinstance(said, dict):
        return _count(said.get("healthy")), _count(said.get("total"))
    return None, None


def _out_state(reason: str | None) -> str:
    if reason in ("draining", "pending"):
        return reason
    return "unhealthy"


def _requests(metrics: MetricSet, names: MetricNames) -> float | None:
    """Client inference requests so far (not the probes, which both routers count too)."""
    if "pdkit_lb_requests_total" in metrics:
        return math.fsum(
            s.value
            for s in metrics.samples("pdkit_lb_requests_total")
            if s.labels.get("route") in PDKIT_CLIENT_ROUTES
        )
    value = metrics.first_total(names.requests)
    if value is not None or "smg_http_requests_total" not in metrics:
        return value
    return math.fsum(
        s.value
        for s in metrics.samples("smg_http_requests_total")
        if s.labels.get("path") not in _NOT_CLIENT_PATHS
    )


def _observed(metrics: MetricSet, candidates: tuple[str, ...]) -> str | None:
    """The first of the candidate histograms that holds observations (else the first there)."""
    present = [n for n in candidates if metrics.histogram(n) is not None]
    for name in present:
        hist = metrics.histogram(name)
        if hist is not None and hist.count > 0:
            return name
    return present[0] if present else None


def latency(hist: Histogram | None, limit_ms: float) -> Latency | None:
    """Percentiles and SLO share of a seconds histogram; None without observations."""
    if hist is None or hist.count <= 0:
        return None
    ms = [hist.quantile(q) for q in QUANTILES]
    p50, p90, p99 = (None if v is None else v * 1000 for v in ms)
    return Latency(p50, p90, p99, int(hist.count), limit_ms, hist.share_at_most(limit_ms / 1000))


def _parse(fetched: Fetched | None) -> MetricSet | None:
    if fetched is None or not fetched.ok:
        return None
    try:
        return parse_metrics(fetched.body, FAMILIES)
    except ProbeError:
        return None


def _state(answers: RouterAnswers, metrics: MetricSet | None) -> tuple[State, bool | None, str]:
    health, readiness = answers.health, answers.readiness
    if health.failure in ("refused", "unreachable", "connect_timeout"):
        return "down", None, health.detail
    if health.failure is not None:
        return "unhealthy", None, f"/health: {health.detail}"
    if health.status in (401, 403):
        return "unhealthy", None, f"/health answered HTTP {health.status}: set the router API key"
    said = health.json()
    if (isinstance(said, dict) and said.get("status") == "draining") or (
        metrics is not None and (metrics.maximum("pdkit_lb_draining") or 0) > 0
    ):
        return "draining", False, "draining (stopping: finishes in-flight requests)"
    if readiness.status == 200:
        return "healthy", True, ""
    if readiness.status == 503:
        return "unhealthy", False, "not ready"
    if health.status == 200:  # a router without /readiness
        return "healthy", None, ""
    return "unhealthy", None, f"/health answered HTTP {health.status}"


def evaluate_router(
    answers: RouterAnswers,
    slo: SLO,
    earlier: Fetched | None = None,
    latency_over_window: bool = False,
) -> RouterStatus:
    """The router's status from one round.

    `earlier` is an earlier scrape of its metrics (for request rates, and for windowed
    latencies when `latency_over_window`, as `--watch` does).
    """
    target = answers.target
    names = METRIC_NAMES[target.kind]
    notes: list[str] = []
    metrics = _parse(answers.metrics)
    if answers.metrics.ok and metrics is None:
        notes.append("metrics are not Prometheus text")
    elif not answers.metrics.ok and answers.health.answered:
        notes.append(f"no metrics at {target.metrics_url}: {answers.metrics.why}")
    before = _parse(earlier)

    state, ready, cause = _state(answers, metrics)
    readiness = answers.readiness.json(any_status=True)
    workers = _routed_workers(answers.workers.json())
    if workers is None and metrics is not None:
        workers = _workers_from_metrics(metrics, readiness)

    counts = {role: _role_counts(role, workers, readiness) for role in ("prefill", "decode")}
    if ready is False and state == "unhealthy":
        missing = [role for role, (healthy, _) in counts.items() if healthy == 0]
        if missing:
            cause = "not ready: no healthy " + " and no healthy ".join(missing)
        else:
            cause = "not ready (/readiness says 503)"
    problems = [cause] if cause else []
    canary_pairs, canary_wrong = _canary_wrong(metrics) if metrics is not None else (0, ())
    problems += [
        f"token canary: prefill {p} x decode {d} gives other tokens than the other pairs"
        for p, d in canary_wrong
    ]

    requests_total = rate_s = window_s = None
    ttft = tpot = None
    window = "since start"
    if metrics is not None:
        now_requests = _requests(metrics, names)
        requests_total = int(now_requests) if now_requests is not None else None
        if before is not None and earlier is not None:
            window_s = answers.metrics.at - earlier.at
            rate_s = rate(now_requests, _requests(before, names), window_s)
        ttft_name, tpot_name = _observed(metrics, names.ttft), _observed(metrics, names.tpot)
        ttft_hist = metrics.histogram(ttft_name) if ttft_name else None
        tpot_hist = metrics.histogram(tpot_name) if tpot_name else None
        if latency_over_window and before is not None and ttft_hist is not None and ttft_name:
            recent = ttft_hist.since(before.histogram(ttft_name))
            if recent.count > 0:
                ttft_hist, window = recent, "last round"
                if tpot_hist is not None and tpot_name:
                    tpot_hist = tpot_hist.since(before.histogram(tpot_name))
        ttft = latency(ttft_hist, slo.ttft_ms)
        tpot = latency(tpot_hist, slo.tpot_ms)
    inflight = metrics.total("pdkit_lb_inflight_requests") if metrics is not None else None

    shares = [x.within for x in (ttft, tpot) if x is not None]
    slo_met = all(s >= slo.attainment for s in shares if s is not None) if shares else None
    return RouterStatus(
        name=target.name,
        kind=target.kind,
        endpoint=target.url.removeprefix("http://"),
        state=state,
        cause=cause,
        problems=tuple(problems),
        notes=tuple(notes),
        ready=ready,
        workers=workers,
        healthy_prefill=counts["prefill"][0],
        healthy_decode=counts["decode"][0],
        total_prefill=counts["prefill"][1],
        total_decode=counts["decode"][1],
        requests_total=requests_total,
        requests_per_s=rate_s,
        rate_window_s=window_s,
        inflight=int(inflight) if inflight is not None else None,
        ttft=ttft,
        tpot=tpot,
        tpot_is_itl=names.tpot_is_itl,
        latency_window=window,
        slo_attainment=slo.attainment,
        slo_met=slo_met,
        kv_index=_kv_index(metrics) if metrics is not None else (),
        canary_pairs=canary_pairs,
        canary_wrong=canary_wrong,
        processes=_processes(readiness),
    )


def _kv_index(metrics: MetricSet) -> tuple[KvIndexView, ...]:
    def per_worker(name: str) -> dict[str, float]:
        return {s.labels.get("worker", ""): s.value for s in metrics.samples(name)}

    blocks = per_worker("pdkit_lb_kv_index_blocks")
    live = per_worker("pdkit_lb_kv_index_live")
    hit = per_worker("pdkit_lb_kv_hit_rate")
    predictions = per_worker("pdkit_lb_kv_predictions_total")
    agreed = per_worker("pdkit_lb_kv_predictions_agreed_total")
    return tuple(
        KvIndexView(
            worker=url,
            blocks=int(count),
            live=live.get(url, 0) > 0,
            hit_rate=hit.get(url),
            predictions=int(predictions.get(url, 0)),
            agreed=int(agreed.get(url, 0)),
        )
        for url, count in sorted(blocks.items())
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
