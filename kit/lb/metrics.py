"""Prometheus metrics of the load balancer, in a registry of its own (no process globals).

Latencies are seconds as the client sees them: end to end, time to first token (first SSE data
event written to the client) and inter-token latency (gap between data events; events that
arrive together count the gap once and zero for the rest).

The request path only bumps plain integers and floats (`Histogram.observe` is a bisect and two
additions: prometheus_client's own metrics take a lock per update, which costs more than the
rest of a streamed token's handling). A collector turns them into metric families at scrape
time, and reads the worker gauges from the pool.

    pdkit_lb_requests_total{route,status}             counter
    pdkit_lb_received_total                           counter (PD requests as they arrive)
    pdkit_lb_received_prompt_tokens_total             counter: their prompt tokens, estimated
                                                       as admission does (token ids counted,
                                                       text UTF-8 bytes / 4)
    pdkit_lb_request_duration_seconds{route,stream}   histogram
    pdkit_lb_time_to_first_token_seconds{route}       histogram (streams)
    pdkit_lb_inter_token_latency_seconds{route}       histogram (streams)
    pdkit_lb_errors_total{cause}                      counter
    pdkit_lb_retries_total{role}                      counter (the role whose leg failed)
    pdkit_lb_migrations_total{reason}                 counter (died, stalled)
    pdkit_lb_migrations_refused_total{reason}         counter (why a cut stream was not continued)
    pdkit_lb_held_total{role}                         counter (requests that waited for a worker)
    pdkit_lb_held_requests                            gauge
    pdkit_lb_queued_requests                          gauge (waiting for a prefill with room:
                                                       --prefill-max-inflight)
    pdkit_lb_inflight_requests                        gauge
    pdkit_lb_draining                                 gauge (1 after SIGTERM)
    pdkit_lb_worker_inflight{worker,role}             gauge
    pdkit_lb_worker_healthy{worker,role}              gauge (1 routable, 0 not)
    pdkit_lb_worker_out{worker,role,reason}           gauge (1 while out: pending,
                                                       health_check, connection_error, draining,
                                                       canary)
    pdkit_lb_worker_requests_total{worker,role}       counter
    pdkit_lb_worker_ejections_total{worker,role,reason} counter
    pdkit_lb_health_probes_total{worker,result}       counter (ok, failed, and busy: a
                                                       timeout forgiven to a worker finishing
                                                       requests)
    pdkit_lb_admitted_total{priority}                 counter (admission on)
    pdkit_lb_rejected_total{reason,priority}          counter (429s: reason ttft or tpot)
    pdkit_lb_admission_ttft_error_ratio               histogram: observed / predicted TTFT
                                                       (streams; non-streaming: the prefill's end)
    pdkit_lb_admission_tpot_error_ratio               histogram: observed / predicted TPOT
    pdkit_lb_admission_prefill_queue_tokens{worker}   gauge: prompt tokens ahead on a prefill
    pdkit_lb_admission_prefill_rate_tokens{worker}    gauge: its measured prompt tokens per
                                                       busy second (absent while learning)
    pdkit_lb_admission_decode_step_seconds{worker}    gauge: predicted step at one more request
    pdkit_lb_kv_index_blocks{worker}                  gauge: blocks its KV events say it holds
                                                       (cache_aware; all DP ranks)
    pdkit_lb_kv_index_live{worker}                    gauge: 1 while its index is believed
    pdkit_lb_kv_index_pending_blocks{worker}          gauge: blocks of requests routed there
                                                       that its events have not reported yet
    pdkit_lb_kv_pending_confirmed_total{worker}       counter: pending records its events
                                                       confirmed (the prompt stored)
    pdkit_lb_kv_pending_dropped_total{worker}         counter: pending records dropped (the
                                                       prefill failed, no event in time, or
                                                       the rank's index cleared)
    pdkit_lb_kv_index_gaps_total{worker}              counter: sequence gaps (rank cleared)
    pdkit_lb_kv_index_restarts_total{worker}          counter: publisher restarts seen
    pdkit_lb_kv_predictions_total{worker}             counter: requests with a prediction that
                                                       the prefill answered with its count
    pdkit_lb_kv_predictions_agreed_total{worker}      counter: of those, predicted == actual
    pdkit_lb_kv_hit_rate{worker}                      gauge: predicted cached / prompt tokens
                                                       (predictions count pending blocks)
    pdkit_lb_canary_pair{prefill,decode,state}        gauge: 1 for each pair's state in the
                                                       last token canary round (ok, wrong,
                                                       failed; --canary-interval > 0)
    pdkit_lb_canary_wrong_total{prefill,decode}       counter: rounds the pair gave wrong tokens
    pdkit_lb_canary_rounds_total                      counter
    pdkit_lb_canary_round_seconds                     gauge: how long the last round took
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kit.lb.admission import Admission
from kit.lb.cache_aware import CacheAware
from kit.lb.canary import Canary
from kit.lb.workers import Worker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3, 6, 12, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


class Histogram:
    """A single-threaded histogram: `observe(seconds)` is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, +Inf last, as Prometheus wants them."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(total)))
        return out


class _Family:
    """Histograms of one metric by label values, created on first use."""

    def __init__(self, name: str, doc: str, labels: list[str], bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, labels, bounds
        self.children: dict[tuple[str, ...], Histogram] = {}

    def child(self, *values: str) -> Histogram:
        hist = self.children.get(values)
        if hist is None:
            hist = self.children[values] = Histogram(self.bounds)
        return hist

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, hist in sorted(self.children.items()):
            fam.add_metric(list(values), hist.cumulative(), hist.sum)
        return fam


class LbMetrics:
    """The metrics of one load balancer instance; `render()` gives the exposition text."""

    def __init__(self, workers: Callable[[], Iterable[Worker]]) -> None:
        self._workers = workers
        self.requests: dict[tuple[str, int], int] = {}
        self.received = 0
        self.received_tokens = 0.0
        self.errors: dict[str, int] = {}
        self.retries: dict[str, int] = {}
        self.migrations: dict[str, int] = {}
        self.migrations_refused: dict[str, int] = {}
        self.holds: dict[str, int] = {}
        self.held = 0
        self.queued = 0
        self.inflight = 0
        self.draining = False
        self.duration = _Family(
            "pdkit_lb_request_duration_seconds",
            "End-to-end latency seen by the client (s)",
            ["route", "stream"],
            E2E_BUCKETS,
        )
        self.ttft = _Family(
            "pdkit_lb_time_to_first_token_seconds",
            "Time to the first streamed event (s)",
            ["route"],
            TTFT_BUCKETS,
        )
        self.itl = _Family(
            "pdkit_lb_inter_token_latency_seconds",
            "Gap between streamed events (s)",
            ["route"],
            ITL_BUCKETS,
        )
        self._duration_children: dict[tuple[str, bool], Histogram] = {}
        self.admission: Admission | None = None
        self.cache_aware: CacheAware | None = None
        self.canary: Canary | None = None
        self.admitted: dict[str, int] = {}
        self.rejected: dict[tuple[str, str], int] = {}
        self.ttft_error = Histogram(RATIO_BUCKETS)
        self.tpot_error = Histogram(RATIO_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def request(self, route: str, status: int, seconds: float, stream: bool) -> None:
        """Count one finished client request and its end-to-end latency (s)."""
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        hist = self._duration_children.get((route, stream))
        if hist is None:
            hist = self.duration.child(route, "true" if stream else "false")
            self._duration_children[(route, stream)] = hist
        hist.observe(seconds)

    def receive(self, prompt_tokens: float) -> None:
        """Count one PD request as it arrives, with its estimated prompt length: the mix the
        prefills face next, before any of it finishes (`pdkit autoscale` reads it)."""
        self.received += 1
        self.received_tokens += prompt_tokens

    def stream_timers(self, route: str) -> tuple[Histogram, Histogram]:
        """(TTFT, inter-token) histograms for a route."""
        return self.ttft.child(route), self.itl.child(route)

    def error(self, cause: str) -> None:
        self.errors[cause] = self.errors.get(cause, 0) + 1

    def retry(self, role: str) -> None:
        self.retries[role] = self.retries.get(role, 0) + 1

    def migrate(self, reason: str) -> None:
        self.migrations[reason] = self.migrations.get(reason, 0) + 1

    def migration_refused(self, reason: str) -> None:
        self.migrations_refused[reason] = self.migrations_refused.get(reason, 0) + 1

    def hold(self, role: str) -> None:
        self.holds[role] = self.holds.get(role, 0) + 1

    def admit(self, priority: str) -> None:
        self.admitted[priority] = self.admitted.get(priority, 0) + 1

    def reject(self, reason: str, priority: str) -> None:
        key = (reason, priority)
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def render(self) -> bytes:
        """The exposition text for /metrics."""
        return generate_latest(self.registry)

    def families(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "pdkit_lb_requests", "Client requests by route and status", labels=["route", "status"]
        )
        for (route, status), count in sorted(self.requests.items()):
            requests.add_metric([route, str(status)], count)
        errors = CounterMetricFamily(
            "pdkit_lb_errors", "Failed requests by cause", labels=["cause"]
        )
        for cause, count in sorted(self.errors.items()):
            errors.add_metric([cause], count)
        retries = CounterMetricFamily(
            "pdkit_lb_retries",
            "Requests sent again on a fresh pair before the client got a byte, by the role "
            "whose leg failed",
            labels=["role"],
        )
        for role, count in sorted(self.retries.items()):
            retries.add_metric([role], count)
        migrations = CounterMetricFamily(
            "pdkit_lb_migrations",
            "Streams continued on another pair, by why the decode leg ended (died, stalled)",
            labels=["reason"],
        )
        for reason, count in sorted(self.migrations.items()):
            migrations.add_metric([reason], count)
        refused = CounterMetricFamily(
            "pdkit_lb_migrations_refused",
            "Cut streams that could not be continued exactly (they end with an error event)",
            labels=["reason"],
        )
        for reason, count in sorted(self.migrations_refused.items()):
            refused.add_metric([reason], count)
        received = CounterMetricFamily(
            "pdkit_lb_received", "PD requests received (counted as they arrive)"
        )
        received.add_metric([], self.received)
        received_tokens = CounterMetricFamily(
            "pdkit_lb_received_prompt_tokens",
            "Prompt tokens of the PD requests received, estimated (token ids counted, text "
            "UTF-8 bytes / 4)",
        )
        received_tokens.add_metric([], self.received_tokens)
        holds = CounterMetricFamily(
            "pdkit_lb_held",
            "Requests that waited for a worker of a role that had none routable",
            labels=["role"],
        )
        for role, count in sorted(self.holds.items()):
            holds.add_metric([role], count)
        yield from (
            requests,
            self.duration.family(),
            self.ttft.family(),
            self.itl.family(),
            errors,
            retries,
            migrations,
            refused,
            received,
            received_tokens,
            holds,
        )
        yield GaugeMetricFamily(
            "pdkit_lb_held_requests", "Requests waiting for a worker now", value=self.held
        )
        yield GaugeMetricFamily(
            "pdkit_lb_queued_requests",
            "Requests waiting for a prefill with room now (--prefill-max-inflight)",
            value=self.queued,
        )
        yield GaugeMetricFamily(
            "pdkit_lb_inflight_requests", "Client requests in flight", value=self.inflight
        )
        yield GaugeMetricFamily(
            "pdkit_lb_draining",
            "1 while draining after SIGTERM",
            value=1.0 if self.draining else 0.0,
        )
        yield from _worker_families(self._workers())
        if self.admission is not None:
            yield from self._admission_families(self.admission)
        if self.cache_aware is not None:
            yield from _kv_families(self.cache_aware)
        if self.canary is not None:
            yield from self.canary.families()

    def _admission_families(self, admission: Admission) -> Iterator[Metric]:
        admitted = CounterMetricFamily(
            "pdkit_lb_admitted", "Requests admitted, by priority", labels=["priority"]
        )
        for priority, count in sorted(self.admitted.items()):
            admitted.add_metric([priority], count)
        rejected = CounterMetricFamily(
            "pdkit_lb_rejected",
            "Requests refused with 429, by reason (ttft, tpot) and priority",
            labels=["reason", "priority"],
        )
        for (reason, priority), count in sorted(self.rejected.items()):
            rejected.add_metric([reason, priority], count)
        yield admitted
        yield rejected
        for name, doc, hist in (
            ("pdkit_lb_admission_ttft_error_ratio", "Observed / predicted TTFT", self.ttft_error),
            ("pdkit_lb_admission_tpot_error_ratio", "Observed / predicted TPOT", self.tpot_error),
        ):
            fam = HistogramMetricFamily(name, doc)
            fam.add_metric([], hist.cumulative(), hist.sum)
            yield fam
        prefills, decodes = admission.gauges()
        queue = GaugeMetricFamily(
            "pdkit_lb_admission_prefill_queue_tokens",
            "Prompt tokens ahead on a prefill (this router's and other clients')",
            labels=["worker"],
        )
        rate = GaugeMetricFamily(
            "pdkit_lb_admission_prefill_rate_tokens",
            "Prompt tokens a prefill serves per busy second (absent while learning)",
            labels=["worker"],
        )
        for url, model in sorted(prefills.items()):
            queue.add_metric([url], model.ahead())
            served = model.rate()
            if served is not None:
                rate.add_metric([url], served)
        step = GaugeMetricFamily(
            "pdkit_lb_admission_decode_step_seconds",
            "Predicted decode step time with one more request (absent while learning)",
            labels=["worker"],
        )
        workers = {w.url: w for w in self._workers()}
        for url, decode in sorted(decodes.items()):
            worker = workers.get(url)
            predicted = decode.step((worker.inflight if worker else 0) + decode.external + 1)
            if predicted is not None:
                step.add_metric([url], predicted)
        yield from (queue, rate, step)


def _kv_families(policy: CacheAware) -> Iterator[Metric]:
    label = ["worker"]
    blocks = GaugeMetricFamily(
        "pdkit_lb_kv_index_blocks", "Blocks indexed from KV events", labels=label
    )
    live = GaugeMetricFamily(
        "pdkit_lb_kv_index_live", "1 while the index is believed", labels=label
    )
    gaps = CounterMetricFamily("pdkit_lb_kv_index_gaps", "KV event sequence gaps", labels=label)
    restarts = CounterMetricFamily(
        "pdkit_lb_kv_index_restarts", "KV event publisher restarts", labels=label
    )
    predictions = CounterMetricFamily(
        "pdkit_lb_kv_predictions", "Predictions the prefill answered", labels=label
    )
    agreed = CounterMetricFamily(
        "pdkit_lb_kv_predictions_agreed", "Predictions equal to the cached tokens", labels=label
    )
    hit = GaugeMetricFamily(
        "pdkit_lb_kv_hit_rate", "Predicted cached tokens / prompt tokens", labels=label
    )
    pending = GaugeMetricFamily(
        "pdkit_lb_kv_index_pending_blocks",
        "Blocks of routed requests not reported by KV events yet",
        labels=label,
    )
    confirmed = CounterMetricFamily(
        "pdkit_lb_kv_pending_confirmed", "Pending records KV events confirmed", labels=label
    )
    dropped = CounterMetricFamily(
        "pdkit_lb_kv_pending_dropped",
        "Pending records dropped (prefill failed, no event in time, index cleared)",
        labels=label,
    )
    for url, cache in sorted(policy.index.workers.items()):
        blocks.add_metric([url], cache.size())
        live.add_metric([url], 1.0 if cache.live else 0.0)
        gaps.add_metric([url], sum(r.gaps for r in cache.ranks))
        restarts.add_metric([url], sum(r.restarts for r in cache.ranks))
        predictions.add_metric([url], cache.predictions)
        agreed.add_metric([url], cache.agreed)
        if cache.prompt_tokens:
            hit.add_metric([url], cache.predicted_tokens / cache.prompt_tokens)
        pending.add_metric([url], cache.pending_size())
        confirmed.add_metric([url], sum(r.confirmed for r in cache.ranks))
        dropped.add_metric([url], sum(r.dropped for r in cache.ranks))
    yield from (blocks, live, gaps, restarts, predictions, agreed, hit, pending, confirmed, dropped)


def _worker_families(workers: Iterable[Worker]) -> Iterator[Metric]:
    inflight = GaugeMetricFamily(
        "pdkit_lb_worker_inflight",
        "Requests in flight on a worker (legs)",
        labels=["worker", "role"],
    )
    healthy = GaugeMetricFamily(
        "pdkit_lb_worker_healthy", "1 if the worker is routable, else 0", labels=["worker", "role"]
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
    for w in workers:
        inflight.add_metric([w.url, w.role], w.inflight)
        healthy.add_metric([w.url, w.role], 1.0 if w.routable else 0.0)
        if not w.routable:
            out.add_metric([w.url, w.role, w.reason_kind or w.state.value], 1.0)
        requests.add_metric([w.url, w.role], w.requests)
        for reason, count in sorted(w.ejections.items()):
            ejections.add_metric([w.url, w.role, reason], count)
        probes.add_metric([w.url, "ok"], w.probes_ok)
        probes.add_metric([w.url, "failed"], w.probes_failed)
        if w.probes_busy:
            probes.add_metric([w.url, "busy"], w.probes_busy)
    yield from (inflight, healthy, out, requests, ejections, probes)


class _Collector(Collector):
    def __init__(self, metrics: LbMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families()
