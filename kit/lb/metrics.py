"""Prometheus metrics of the load balancer, in a registry of its own (no process globals).

Latencies are seconds as the client sees them: end to end, time to first token (first SSE data
event written to the client) and inter-token latency (gap between data events; events that
arrive together count the gap once and zero for the rest). Worker gauges are read from the pool
at scrape time, so the request path never touches them.

    pdkit_lb_requests_total{route,status}             counter
    pdkit_lb_request_duration_seconds{route,stream}   histogram
    pdkit_lb_time_to_first_token_seconds{route}       histogram (streams)
    pdkit_lb_inter_token_latency_seconds{route}       histogram (streams)
    pdkit_lb_errors_total{cause}                      counter
    pdkit_lb_retries_total{role}                      counter
    pdkit_lb_inflight_requests                        gauge
    pdkit_lb_draining                                 gauge (1 after SIGTERM)
    pdkit_lb_worker_inflight{worker,role}             gauge
    pdkit_lb_worker_healthy{worker,role}              gauge (1 routable, 0 not)
    pdkit_lb_worker_out{worker,role,reason}           gauge (1 while out: pending,
                                                       health_check, connection_error, draining)
    pdkit_lb_worker_requests_total{worker,role}       counter
    pdkit_lb_worker_ejections_total{worker,role,reason} counter
    pdkit_lb_health_probes_total{worker,result}       counter
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kit.lb.workers import Worker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3, 6, 12, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5)


class _WorkerCollector(Collector):
    """Per-worker gauges and counters, read from the worker objects at scrape time."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily(
            "pdkit_lb_worker_inflight",
            "Requests in flight on a worker (legs)",
            labels=["worker", "role"],
        )
        healthy = GaugeMetricFamily(
            "pdkit_lb_worker_healthy",
            "1 if the worker is routable, else 0",
            labels=["worker", "role"],
        )
        out = GaugeMetricFamily(
            "pdkit_lb_worker_out",
            "1 while a worker is out, by reason",
            labels=["worker", "role", "reason"],
        )
        requests = CounterMetricFamily(
            "pdkit_lb_worker_requests", "Requests sent to a worker", labels=["worker", "role"]
        )
        ejections = CounterMetricFamily(
            "pdkit_lb_worker_ejections",
            "Times a worker was taken out, by reason",
            labels=["worker", "role", "reason"],
        )
        probes = CounterMetricFamily(
            "pdkit_lb_health_probes", "Active health probes by result", labels=["worker", "result"]
        )
        for w in self._workers():
            inflight.add_metric([w.url, w.role], w.inflight)
            healthy.add_metric([w.url, w.role], 1.0 if w.routable else 0.0)
            if not w.routable:
                out.add_metric([w.url, w.role, w.reason_kind or w.state.value], 1.0)
            requests.add_metric([w.url, w.role], w.requests)
            for reason, count in sorted(w.ejections.items()):
                ejections.add_metric([w.url, w.role, reason], count)
            probes.add_metric([w.url, "ok"], w.probes_ok)
            probes.add_metric([w.url, "failed"], w.probes_failed)
        yield from (inflight, healthy, out, requests, ejections, probes)


class LbMetrics:
    """The metrics of one load balancer instance."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "pdkit_lb_requests",
            "Client requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self._duration = Histogram(
            "pdkit_lb_request_duration_seconds",
            "End-to-end latency seen by the client (s)",
            ["route", "stream"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "pdkit_lb_time_to_first_token_seconds",
            "Time to the first streamed event (s)",
            ["route"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self._itl = Histogram(
            "pdkit_lb_inter_token_latency_seconds",
            "Gap between streamed events (s)",
            ["route"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self._errors = Counter("pdkit_lb_errors", "Failed requests by cause", ["cause"], registry=r)
        self._retries = Counter(
            "pdkit_lb_retries", "Retries on another worker", ["role"], registry=r
        )
        self.inflight = Gauge("pdkit_lb_inflight_requests", "Client requests in flight", registry=r)
        self.draining = Gauge("pdkit_lb_draining", "1 while draining after SIGTERM", registry=r)
        r.register(_WorkerCollector(workers))
        # Label lookups cost more than the increments: keep the children.
        self._request_children: dict[tuple[str, int], Counter] = {}
        self._duration_children: dict[tuple[str, bool], Histogram] = {}
        self._stream_children: dict[str, tuple[Histogram, Histogram]] = {}

    def request(self, route: str, status: int, seconds: float, stream: bool) -> None:
        """Count one finished client request and its end-to-end latency (s)."""
        child = self._request_children.get((route, status))
        if child is None:
            child = self._requests.labels(route, str(status))
            self._request_children[(route, status)] = child
        child.inc()
        hist = self._duration_children.get((route, stream))
        if hist is None:
            hist = self._duration.labels(route, "true" if stream else "false")
            self._duration_children[(route, stream)] = hist
        hist.observe(seconds)

    def stream_timers(self, route: str) -> tuple[Histogram, Histogram]:
        """(TTFT, inter-token) histograms for a route."""
        pair = self._stream_children.get(route)
        if pair is None:
            pair = (self._ttft.labels(route), self._itl.labels(route))
            self._stream_children[route] = pair
        return pair

    def error(self, cause: str) -> None:
        self._errors.labels(cause).inc()

    def retry(self, role: str) -> None:
        self._retries.labels(role).inc()

    def render(self) -> bytes:
        """The exposition text for /metrics."""
        return generate_latest(self.registry)
