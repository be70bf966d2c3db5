"""A load point's numbers: throughput, SLO attainment, goodput, latency percentiles, errors,
and where requests went (per prefill and decode).

Definitions (DistServe, Zhong et al. OSDI'24; vLLM and SGLang's bench_serving):
- TTFT: send to the first token; TPOT: (last token - first token) / (output tokens - 1);
  ITL: every gap between two tokens; E2E: send to the last byte. All in ms.
- A request attains the SLO when it was answered and its TTFT <= `slo.ttft_ms` and its TPOT
  <= `slo.tpot_ms`; errors and timeouts count as misses. Attainment is the share of the
  point's measured requests (warm-up excluded) that attain it.
- Throughput and goodput of a point: the requests answered (or attaining the SLO) per second
  of the time requests were being sent (first to last send), that is the send rate times their
  share, which a steady deployment completes at; a point's tail (the last answers) does not
  dilute them. Output tokens/s are over the point's whole wall time.
- Goodput of a deployment (`pdkit bench --search`): the highest offered rate whose attainment
  is >= `slo.attainment` with a steady queue: a point whose TTFT climbs through it (its last
  third's p50 at least twice its first third's, and higher by a tenth of the TTFT objective or
  more) is not sustained however many of its requests attained the SLO (`kit.perf.sweep`, the
  rule the model's goodput uses).
- Rejected: requests a router refused at the door with 429 (pdkit's admission). They count as
  misses in the attainment above; `admitted_attainment` leaves them out (good / not rejected).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.bench.machine import Bottleneck, verdict
from kit.bench.records import RequestRecord
from kit.bench.runner import PointResult
from kit.perf import sweep
from kit.topology.schema import SLO

QUANTILES = (0.5, 0.9, 0.99)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The `q`-quantile (0..1), linearly interpolated; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Percentiles:
    """p50/p90/p99 of one latency (ms); None where no request gave a value."""

    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        p50, p90, p99 = (quantile(values, q) for q in QUANTILES)
        return cls(p50, p90, p99)

    def to_json(self) -> dict[str, float | None]:
        return {
            k: None if v is None else round(v, 3)
            for k, v in (("p50", self.p50), ("p90", self.p90), ("p99", self.p99))
        }


@dataclass(frozen=True)
class WorkerShare:
    """Requests one worker took part in, and how many of them failed."""

    requests: int
    failed: int


@dataclass
class PointSummary:
    """One point, measured requests only (warm-up left out). Rates are requests/s over the
    time requests were being sent (see the module doc), tokens/s over the wall time."""

    rate: float | None
    concurrency: int | None
    requests: int
    ok: int
    good: int
    attainment: float
    wall_s: float
    throughput: float
    goodput: float
    output_tokens_per_s: float
    sent_rate: float
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    errors: dict[str, int]
    error_examples: dict[str, str]
    prefill: dict[str, WorkerShare]
    decode: dict[str, WorkerShare]
    prompt_token_drift: float | None
    """Mean of (server's prompt tokens / tokens asked) - 1: 0 when the server counts as the
    prompt builder does (the sim); None when no server count came back."""
    send_lag_p90_ms: float
    machine: dict[str, Any]
    rejected: int = 0
    """Requests answered 429 (refused by the router's admission)."""
    notes: list[str] = field(default_factory=list)
    attainment_met: bool | None = None
    """Set by a search: whether this point met the SLO's attainment target with a steady queue
    (`meets`)."""
    bottlenecks: set[Bottleneck] = field(default_factory=set)
    """What besides the deployment set this point's pace: the client, this machine."""
    ttft_trend_ms: tuple[float, float] | None = None
    """TTFT p50 of the first and the last third of the point (ms): a queue that grows shows."""
    queue_growing: bool = False
    """The trend marks a growing queue (`kit.perf.sweep.queue_growing`): the deployment does
    not sustain this rate, whatever the attainment of this finite point."""
    cache: CacheSummary | None = None
    """Cached prompt tokens by source, when the answers report them."""

    def meets(self, slo: SLO) -> bool:
        """Attainment at least the target, with a steady queue (the model's rule too)."""
        return self.attainment >= slo.attainment and not self.queue_growing

    @property
    def admitted_attainment(self) -> float:
        """Share of the requests not refused with 429 that attained the SLO."""
        admitted = self.requests - self.rejected
        return self.good / admitted if admitted else 0.0

    @property
    def label(self) -> str:
        if self.rate is not None:
            return f"{self.rate:g} req/s"
        return f"{self.concurrency} users"

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "ok": self.ok,
            "good": self.good,
            "attainment": round(self.attainment, 4),
            "wall_s": round(self.wall_s, 3),
            "throughput_rps": round(self.throughput, 4),
            "goodput_rps": round(self.goodput, 4),
            "output_tokens_per_s": round(self.output_tokens_per_s, 2),
            "sent_rps": round(self.sent_rate, 4),
            "ttft_ms": self.ttft_ms.to_json(),
            "tpot_ms": self.tpot_ms.to_json(),
            "itl_ms": self.itl_ms.to_json(),
            "e2e_ms": self.e2e_ms.to_json(),
            "errors": self.errors,
            "error_examples": self.error_examples,
            "rejected": self.rejected,
            "admitted_attainment": round(self.admitted_attainment, 4),
            "prefill": {k: vars(v) for k, v in self.prefill.items()},
            "decode": {k: vars(v) for k, v in self.decode.items()},
            "prompt_token_drift": None
            if self.prompt_token_drift is None
            else round(self.prompt_token_drift, 4),
            "send_lag_p90_ms": round(self.send_lag_p90_ms, 3),
            "ttft_trend_ms": None
            if self.ttft_trend_ms is None
            else [round(v, 3) for v in self.ttft_trend_ms],
            "queue_growing": self.queue_growing,
            "machine": self.machine,
            "notes": self.notes,
            "bottlenecks": sorted(self.bottlenecks),
            "cache": None if self.cache is None else self.cache.to_json(),
        }


@dataclass(frozen=True)
class CacheSummary:
    """Prompt tokens of the answered requests: all, taken from a cache, of which from the
    prefill's own cache (device) and from the KV pool (storage); computed is the rest."""

    prompt_tokens: int
    cached_tokens: int
    device_tokens: int | None
    storage_tokens: int | None
    pool_hit_requests: int

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def pool_hit_rate(self) -> float | None:
        if self.storage_tokens is None or not self.prompt_tokens:
            return None
        return self.storage_tokens / self.prompt_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "computed_tokens": self.computed_tokens,
            "device_tokens": self.device_tokens,
            "storage_tokens": self.storage_tokens,
            "pool_hit_requests": self.pool_hit_requests,
            "hit_rate": round(self.hit_rate, 4),
        }

    @classmethod
    def of(cls, ok: Sequence[RequestRecord]) -> CacheSummary | None:
        """None when no answer reported its cached tokens."""
        reported = [r for r in ok if r.cached_tokens is not None]
        if not reported:
            return None
        detailed = [r for r in reported if r.cached_storage is not None]
        return cls(
            prompt_tokens=sum(r.prompt_tokens or r.input_tokens for r in reported),
            cached_tokens=sum(r.cached_tokens or 0 for r in reported),
            device_tokens=sum(r.cached_device or 0 for r in detailed) if detailed else None,
            storage_tokens=sum(r.cached_storage or 0 for r in detailed) if detailed else None,
            pool_hit_requests=sum(1 for r in detailed if r.cached_storage),
        )


def _shares(records: Sequence[RequestRecord], attr: str) -> dict[str, WorkerShare]:
    total: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for record in records:
        worker = getattr(record, attr)
        if worker:
            total[worker] += 1
            failed[worker] += 0 if record.ok else 1
    return {w: WorkerShare(total[w], failed[w]) for w in sorted(total)}


def ttft_trend(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """TTFT p50 (ms) of the first and of the last third of the answered requests, in send
    order; None for fewer than 9 (`kit.perf.sweep.ttft_trend`, the model's rule)."""
    ordered = sorted((r for r in records if r.ok and r.ttft_ms is not None), key=lambda r: r.sent_s)
    return sweep.ttft_trend([r.ttft_ms or 0.0 for r in ordered])


def summarize(point: PointResult, slo: SLO) -> PointSummary:
    """The numbers of one point (see the module doc)."""
    measured = [r for r in point.records if not r.warmup]
    ok = [r for r in measured if r.ok]
    good = sum(1 for r in measured if r.meets(slo))
    if measured:
        first = min(r.sent_s for r in measured)
        last = max(r.sent_s + (r.e2e_ms or 0.0) / 1000 for r in measured)
        wall = max(last - first, 1e-9)
        sends = sorted(r.sent_s for r in measured)
        sent_rate = (len(sends) - 1) / (sends[-1] - sends[0]) if sends[-1] > sends[0] else 0.0
        if sent_rate == 0.0:  # one request, or all at once: over the wall time instead
            sent_rate = len(sends) / wall
    else:
        wall, sent_rate = point.wall_s, 0.0
    errors = Counter(r.error_kind or "error" for r in measured if not r.ok)
    examples: dict[str, str] = {}
    for r in measured:
        if not r.ok and (r.error_kind or "error") not in examples:
            where = f" (decode {r.decode})" if r.decode else ""
            examples[r.error_kind or "error"] = f"{r.error}{where}"
    drifts = [r.prompt_tokens / r.input_tokens - 1 for r in ok if r.prompt_tokens]
    send_lag = quantile([r.send_lag_ms for r in measured], 0.9) or 0.0
    trend = ttft_trend(measured)
    summary = PointSummary(
        rate=point.rate,
        concurrency=point.concurrency,
        requests=len(measured),
        ok=len(ok),
        good=good,
        attainment=good / len(measured) if measured else 0.0,
        wall_s=wall,
        throughput=len(ok) / len(measured) * sent_rate if measured else 0.0,
        goodput=good / len(measured) * sent_rate if measured else 0.0,
        output_tokens_per_s=sum(r.completion_tokens for r in ok) / wall,
        sent_rate=sent_rate,
        ttft_ms=Percentiles.of([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        tpot_ms=Percentiles.of([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        itl_ms=Percentiles.of([gap for r in ok for gap in r.itl_ms]),
        e2e_ms=Percentiles.of([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        errors=dict(errors),
        error_examples=examples,
        prefill=_shares(measured, "prefill"),
        decode=_shares(measured, "decode"),
        prompt_token_drift=sum(drifts) / len(drifts) if drifts else None,
        send_lag_p90_ms=send_lag,
        machine=point.load.to_json(),
        ttft_trend_ms=trend,
        cache=CacheSummary.of(ok),
        queue_growing=sweep.queue_growing(trend, slo),
        rejected=sum(1 for r in measured if r.status == 429),
    )
    for kind, note in verdict(point.load, send_lag):
        summary.bottlenecks.add(kind)
        summary.notes.append(note)
    summary.notes.extend(_error_notes(summary))
    return summary


def suspects(summary: PointSummary) -> list[tuple[str, str, WorkerShare]]:
    """(role, worker, share) of the workers the failures point at: most of a worker's requests
    failed, and not merely because they shared the real culprit. Within a role, a worker is
    named when it failed at least twice as often as the role's others; a role's only worker is
    named when the other role's failures are spread over its workers (it is the common part)."""
    roles = {"prefill": summary.prefill, "decode": summary.decode}

    def rate(share: WorkerShare) -> float:
        return share.failed / share.requests if share.requests else 0.0

    named: dict[str, list[tuple[str, WorkerShare]]] = {}
    for role, shares in roles.items():
        if len(shares) < 2:
            continue
        for worker, share in shares.items():
            others = [rate(s) for w, s in shares.items() if w != worker]
            if rate(share) >= 0.5 and rate(share) >= 2 * (sum(others) / len(others)):
                named.setdefault(role, []).append((worker, share))
    for role, shares in roles.items():
        other = "decode" if role == "prefill" else "prefill"
        if len(shares) == 1 and len(roles[other]) > 1 and other not in named:
            ((worker, share),) = shares.items()
            if rate(share) >= 0.5:
                named[role] = [(worker, share)]
        elif len(shares) == 1 and len(roles[other]) <= 1:
            ((worker, share),) = shares.items()
            if rate(share) >= 0.5:
                named.setdefault(role, []).append((worker, share))
    return [(role, w, s) for role in ("prefill", "decode") for w, s in named.get(role, [])]


def _queue_note(summary: PointSummary) -> list[str]:
    trend = summary.ttft_trend_ms
    if not summary.queue_growing or trend is None:
        return []
    return [
        f"queue still growing: TTFT p50 rose from {trend[0]:.0f} ms (first third) to "
        f"{trend[1]:.0f} ms (last third); the deployment does not sustain this rate, a "
        "longer point would attain less, and --search counts it as missed"
    ]


def _error_notes(summary: PointSummary) -> list[str]:
    """Workers the failures point at, and a server whose prompt token count differs."""
    notes = [
        f"{share.failed} of {share.requests} requests through {role} {worker} failed"
        for role, worker, share in suspects(summary)
    ]
    empty = summary.errors.get("empty", 0)
    if empty:
        notes.append(
            f"{empty} of {summary.requests} requests produced no tokens (answered 200 with "
            "nothing generated): counted as failed, not as goodput; check the served model, "
            "max_tokens and the workers' logs"
        )
    notes += _queue_note(summary)
    if summary.rejected:
        notes.append(
            f"{summary.rejected} of {summary.requests} requests refused with 429 (the router's "
            f"admission); of the others {summary.admitted_attainment:.0%} attained the SLO"
        )
    drift = summary.prompt_token_drift
    if drift is not None and abs(drift) > 0.05:
        notes.append(
            f"the server counted {drift:+.0%} prompt tokens against those asked (its tokenizer "
            "is not the sim's rule); lengths in this report are the asked ones"
        )
    return notes
