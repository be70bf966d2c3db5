"""One interval's workload and latencies, from two scrapes of the router's and the workers'
metrics (pure: the scrapes are inputs).

    rate            PD requests received (pdkit's router: `pdkit_lb_received_total`), else
                    finished client requests (the router's requests counter), / seconds
    input_tokens    the prefills' prompt tokens / the prefills' requests (`sglang:prompt_tokens`,
                    `sglang:num_requests`: counted when a request finishes), unless pdkit's
                    router's estimate for the requests that arrived
                    (`pdkit_lb_received_prompt_tokens_total`) is more than `SHIFT` times off
                    it, or none finished: at a shift, the finished requests are the old
                    workload
    output_tokens   the decodes' generated tokens / the decodes' requests
    TTFT, TPOT      the router's histograms over the interval (pdkit's load balancer times
                    TPOT as the gap between streamed events; smg per request), P50 and P90
    attainment      an estimate: the smaller of the shares of TTFT and of TPOT samples within
                    the SLO (the histograms do not pair them per request)
    stalled         requests waiting on the prefills (theirs and the router's count) when they
                    finished none in an interval longer than the TTFT objective
                    (`stalled_prefills`)

Each instance counts in the role it serves now (`roles`), which a role switch changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kit.autoscale.decide import Mix
from kit.autoscale.model import Observed
from kit.observe.prom import Histogram, MetricSet, increase
from kit.observe.router import METRIC_NAMES
from kit.sizing.calibration import Latencies
from kit.topology.schema import SLO

ITL = "sglang:inter_token_latency_seconds"
PREFILL_WAITING = (
    "sglang:num_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
)
ROUTER_PREFILL_INFLIGHT = "pdkit_lb_worker_inflight"
ROUTER_QUEUED = "pdkit_lb_queued_requests"
RECEIVED = "pdkit_lb_received_total"
RECEIVED_TOKENS = "pdkit_lb_received_prompt_tokens_total"
SHIFT = 2.0
"""How many times the router's estimate of the arriving prompts must differ from the prefills'
count of the finished ones to be taken instead (a shift of the workload)."""
GENERATE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate")
"""The routes whose requests are the workload (not /health, /metrics, /workers)."""


def _requests(metrics: MetricSet | None, names: tuple[str, ...]) -> float | None:
    """Client requests on the generate routes (all requests when the series have no route)."""
    if metrics is None:
        return None
    for name in names:
        found = metrics.samples(name)
        if found:
            return sum(
                s.value
                for s in found
                if s.labels.get("route", GENERATE_ROUTES[0]) in GENERATE_ROUTES
            )
    return None


@dataclass(frozen=True)
class Scrape:
    """The router's metrics and each worker's (by instance name; None when it did not
    answer), taken at `at` (monotonic seconds)."""

    at: float
    router: MetricSet | None
    workers: Mapping[str, MetricSet | None]

    def filled(self, answered: Mapping[str, MetricSet]) -> Scrape:
        """This scrape with each unanswered worker's metrics taken from `answered` (its last
        answer before): its counters then grow over the next interval by what it did in
        both. Lengths are ratios of counters (tokens per request), so a longer window for
        one worker does not bias them; rates come from the router's counter."""
        workers = {
            name: metrics if metrics is not None else answered.get(name)
            for name, metrics in self.workers.items()
        }
        return Scrape(self.at, self.router, workers)


@dataclass(frozen=True)
class Interval:
    """What the interval showed: its length (s), requests finished, the mix (None: nothing
    finished) and the latencies (None: no TTFT sample)."""

    seconds: float
    requests: int
    mix: Mix | None
    observed: Observed | None
    stalled: int = 0
    """Requests waiting or running on the prefills when the prefills finished none in an
    interval longer than the TTFT objective (0: no stall; see `stalled_prefills`)."""
    arrived: int | None = None
    """PD requests pdkit's router received in the interval (None: a router that does not
    count them)."""

    shifted: bool = False
    """The mean prompt is the router's estimate for the arriving requests, not the finished
    ones' (`_input_tokens`): the latencies measured belong to the old workload."""

    @property
    def samples(self) -> int:
        """The requests the mix was measured on: those that arrived where the router counts
        them, else those that finished."""
        return self.arrived if self.arrived is not None else self.requests

    def describe(self) -> str:
        stall = (
            f"; the prefills finished none while {self.stalled} wait on them"
            if self.stalled
            else ""
        )
        came = f", {self.arrived} arrived" if self.arrived is not None else ""
        if self.mix is None:
            return f"{self.requests} request(s) finished{came} in {self.seconds:.0f} s{stall}"
        if self.shifted:
            came += "; prompts as the router estimates the arriving ones: the workload shifted"
        text = (
            f"{self.mix.describe()} ({self.requests} finished{came} in {self.seconds:.0f} s)"
            + stall
        )
        if self.observed is not None:
            lat = self.observed.latencies
            text += (
                f"; TTFT p50/p90 {lat.p50_ttft_ms:.0f}/{lat.p90_ttft_ms:.0f} ms, TPOT "
                f"{lat.p50_tpot_ms:.1f}/{lat.p90_tpot_ms:.1f} ms"
            )
            if self.observed.attainment is not None:
                text += f", ~{self.observed.attainment:.0%} within the SLO"
        return text


def _grown(now: MetricSet | None, before: MetricSet | None, name: str) -> float:
    """A counter's increase; one that first appears in the interval counts from zero (a
    labelled counter has no series before its first request)."""
    if now is None or before is None:
        return 0.0
    return increase(now.total(name), before.total(name) or 0.0) or 0.0


def _hist(
    now: MetricSet | None, before: MetricSet | None, names: tuple[str, ...]
) -> Histogram | None:
    if now is None:
        return None
    for name in names:
        found = now.histogram(name)
        if found is not None:
            return found.since(before.histogram(name) if before is not None else None)
    return None


def _role_sum(now: Scrape, before: Scrape, roles: Mapping[str, str], role: str, name: str) -> float:
    return sum(
        _grown(now.workers.get(w), before.workers.get(w), name)
        for w, r in roles.items()
        if r == role
    )


def _received(now: MetricSet | None, before: MetricSet | None) -> tuple[float, float] | None:
    """(PD requests, their estimated prompt tokens) pdkit's router received between two
    reads of its metrics; None where it does not count them (smg) or restarted between."""
    if now is None or before is None:
        return None
    count, tokens = now.total(RECEIVED), now.total(RECEIVED_TOKENS)
    if count is None or tokens is None:
        return None
    grown = increase(count, before.total(RECEIVED) or 0.0)
    added = increase(tokens, before.total(RECEIVED_TOKENS) or 0.0)
    if grown is None or added is None:
        return None
    return grown, added


def _apart(a: float, b: float) -> bool:
    """True when the two (positive) lengths differ by more than `SHIFT` times."""
    return max(a, b) > SHIFT * min(a, b)


def _input_tokens(finished: float | None, arriving: float | None) -> float | None:
    """The interval's mean prompt: the prefills' own count of the requests they finished,
    unless the router's estimate of the requests that arrived differs from it by more than
    `SHIFT` times (the workload moved, and the finished requests are the old ones), or the
    prefills finished none."""
    if finished is None or arriving is None:
        return finished if finished is not None else arriving
    return arriving if _apart(finished, arriving) else finished


def interval(
    before: Scrape,
    now: Scrape,
    roles: Mapping[str, str],
    kind: str,
    slo: SLO,
    *,
    output_tokens: float | None = None,
) -> Interval:
    """The interval between two scrapes (see the module doc); `kind` is the router's.
    `output_tokens` is the mean answer to assume at a shift when no decode finished in the
    interval (the forecast's: a step at the shift can come before any new answer ends)."""
    seconds = max(now.at - before.at, 1e-9)
    names = METRIC_NAMES[kind]
    requests = 0.0
    if now.router is not None and before.router is not None:
        requests = (
            increase(
                _requests(now.router, names.requests),
                _requests(before.router, names.requests) or 0.0,
            )
            or 0.0
        )
    prompt = _role_sum(now, before, roles, "prefill", "sglang:prompt_tokens_total")
    prefilled = _role_sum(now, before, roles, "prefill", "sglang:num_requests_total")
    generated = _role_sum(now, before, roles, "decode", "sglang:generation_tokens_total")
    decoded = _role_sum(now, before, roles, "decode", "sglang:num_requests_total")
    received = _received(now.router, before.router)
    count = round(requests)
    stalled = 0
    if prefilled <= 0 and seconds * 1000 > slo.ttft_ms:
        stalled = stalled_prefills(now, roles)
    arrived = round(received[0]) if received is not None else None
    finished = prompt / prefilled if prefilled > 0 and count > 0 else None
    inputs = _input_tokens(
        finished,
        received[1] / received[0] if received is not None and received[0] > 0 else None,
    )
    shift = inputs is not None and inputs != finished
    answers = generated / decoded if decoded > 0 else (output_tokens if shift else None)
    if inputs is None or answers is None or (count <= 0 and not arrived):
        return Interval(seconds, count, None, None, stalled, arrived)
    rate = (arrived if arrived is not None else requests) / seconds
    mix = Mix(rate, inputs, answers)
    if shift:
        return Interval(seconds, count, mix, None, stalled, arrived, shifted=True)
    ttft = _hist(now.router, before.router, names.ttft)
    tpot = _hist(now.router, before.router, names.tpot)
    if tpot is None or tpot.count <= 0:
        merged = [
            _hist(now.workers.get(w), before.workers.get(w), (ITL,))
            for w, r in roles.items()
            if r == "decode"
        ]
        tpot = _merge([h for h in merged if h is not None and h.count > 0])
    if ttft is None or ttft.count <= 0 or tpot is None:
        return Interval(seconds, count, mix, None, stalled, arrived)
    q = {
        name: (hist.quantile(0.5), hist.quantile(0.9))
        for name, hist in (("ttft", ttft), ("tpot", tpot))
    }
    if any(v is None for pair in q.values() for v in pair):
        return Interval(seconds, count, mix, None, stalled, arrived)
    latencies = Latencies(
        (q["ttft"][0] or 0.0) * 1000,
        (q["ttft"][1] or 0.0) * 1000,
        (q["tpot"][0] or 0.0) * 1000,
        (q["tpot"][1] or 0.0) * 1000,
    )
    shares = [ttft.share_at_most(slo.ttft_ms / 1000), tpot.share_at_most(slo.tpot_ms / 1000)]
    known = [s for s in shares if s is not None]
    observed = Observed(latencies, min(known) if known else None, count)
    return Interval(seconds, count, mix, observed, stalled, arrived)


def arrival_shift(
    before: MetricSet | None, now: MetricSet | None, forecast_input: float, min_requests: int
) -> str | None:
    """Why an interval should end early, from two reads of pdkit's router's metrics: at
    least `min_requests` requests arrived between them whose mean prompt (the router's
    estimate) is more than `SHIFT` times off `forecast_input`; None otherwise (or where the
    router does not count arrivals)."""
    received = _received(now, before)
    if received is None or received[0] < max(min_requests, 1) or forecast_input <= 0:
        return None
    arrived, tokens = received
    mean = tokens / arrived
    if mean <= 0 or not _apart(mean, forecast_input):
        return None
    return (
        f"{arrived:.0f} requests arrived with {mean:.0f}-token prompts against "
        f"{forecast_input:.0f} forecast"
    )


def stalled_prefills(now: Scrape, roles: Mapping[str, str]) -> int:
    """Requests waiting on the prefills: what the prefills hold (`sglang:num_queue_reqs` +
    `num_running_reqs` + `num_prefill_bootstrap_queue_reqs`, the last waiting for their
    decode's room), or what pdkit's router has sent them and not had back
    (`pdkit_lb_worker_inflight{role="prefill"}`, which also counts requests still on their
    way in) with what it holds for them (`pdkit_lb_queued_requests`), whichever is more.
    Asked when the prefills finished no request in an interval longer than the TTFT
    objective: work that waits that long is past the SLO, so the prefills are saturated, and
    it is exactly then that no finished request tells the prompts' length (a prefill counts
    a request's tokens when it ends)."""
    held = 0.0
    for name, role in roles.items():
        metrics = now.workers.get(name)
        if role != "prefill" or metrics is None:
            continue
        for gauge in PREFILL_WAITING:
            held += metrics.total(gauge) or 0.0
    sent = 0.0
    if now.router is not None:
        sent = sum(
            s.value
            for s in now.router.samples(ROUTER_PREFILL_INFLIGHT)
            if s.labels.get("role") == "prefill"
        ) + (now.router.total(ROUTER_QUEUED) or 0.0)
    return round(max(held, sent))


def _merge(hists: list[Histogram]) -> Histogram | None:
    if not hists:
        return None
    bounds = [b for b, _ in hists[0].buckets]
    if any([b for b, _ in h.buckets] != bounds for h in hists):
        return max(hists, key=lambda h: h.count)
    return Histogram(
        tuple((b, sum(h.buckets[i][1] for h in hists)) for i, b in enumerate(bounds)),
        sum(h.count for h in hists),
        sum(h.sum for h in hists),
    )
