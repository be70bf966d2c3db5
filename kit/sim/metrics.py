"""``/metrics`` and ``/v1/loads``: SGLang's names and shapes, read from the engine.

Gauges (``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``, the PD
queue gauges, KV transfer latency/speed, ...) are set from the engine at each scrape; request
histograms (``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
``sglang:e2e_request_latency_seconds``, ...) are observed when a request finishes. Latencies are
wall seconds as the client sees them. ``pdkit_sim:*`` series are the emulator's own: the bytes
that really crossed Mooncake and how late its step timers fire (its lag).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from kit.perf.scheduler import Mode
from kit.sim.engine import Engine, TransferRecord
from kit.sim.requests import RequestState

# SGLang's /metrics has no `*_created` series (measured on 0.5.23; its multiprocess collector
# writes none): the sim's registry leaves them out too.
disable_created_metrics()  # type: ignore[no-untyped-call]

# sglang/srt/observability/metrics_collector.py default buckets.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
KV_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
KV_SIZE_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
KV_WAIT_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
ENGINE_TYPES = {Mode.NULL: "unified", Mode.PREFILL: "prefill", Mode.DECODE: "decode"}
SGLANG_VERSION = "0.5.23"


class Metrics:
    """One registry per worker (tests run several workers in one process)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        labels = {
            "model_name": engine.args.served_model_name,
            "engine_type": ENGINE_TYPES[engine.mode],
        }
        self.labels = labels
        names = [*labels]
        rank_names = [*names, "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, rank_names, registry=reg)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.max_tokens = gauge("sglang:max_total_num_tokens", "KV pool size in tokens.")
        self.throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.retracted = gauge("sglang:num_retracted_reqs", "The number of retracted requests.")
        self.bootstrap_q = gauge(
            "sglang:num_prefill_bootstrap_queue_reqs", "Requests in the prefill bootstrap queue."
        )
        self.inflight_q = gauge(
            "sglang:num_prefill_inflight_queue_reqs",
            "Requests in the prefill inflight (KV transfer) queue.",
        )
        self.prealloc_q = gauge(
            "sglang:num_decode_prealloc_queue_reqs", "Requests in the decode preallocation queue."
        )
        self.transfer_q = gauge(
            "sglang:num_decode_transfer_queue_reqs", "Requests in the decode transfer queue."
        )

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, rank_names, buckets=buckets, registry=reg)

        # SGLang observes these per transfer: latency, speed and size on the prefill (the
        # sender), bootstrap and allocation waits on the decode. Sizes are the emulated
        # (unscaled) KV volume.
        self.kv_latency = histogram(
            "sglang:kv_transfer_latency_ms", "KV transfer latency (ms).", KV_LATENCY_BUCKETS
        )
        self.kv_speed = histogram(
            "sglang:kv_transfer_speed_gb_s", "KV transfer speed (GB/s).", KV_SPEED_BUCKETS
        )
        self.kv_total_mb = histogram(
            "sglang:kv_transfer_total_mb", "KV transfer size (MB).", KV_SIZE_BUCKETS
        )
        self.kv_bootstrap_ms = histogram(
            "sglang:kv_transfer_bootstrap_ms", "KV transfer bootstrap time (ms).", KV_WAIT_BUCKETS
        )
        self.kv_alloc_ms = histogram(
            "sglang:kv_transfer_alloc_ms",
            "KV transfer allocation waiting time (ms).",
            KV_WAIT_BUCKETS,
        )
        engine.transfer_observers.append(self.observe_transfer)
        self.bootstrap_failed = Counter(
            "sglang:num_bootstrap_failed_reqs",
            "Requests whose bootstrap failed.",
            names,
            registry=reg,
        )
        self.transfer_failed = Counter(
            "sglang:num_transfer_failed_reqs",
            "Requests whose KV transfer failed.",
            names,
            registry=reg,
        )
        # Counted when a request finishes, as SGLang's tokenizer manager does
        # (observe_one_finished_request), by is_streaming: the prompt's every token, cached
        # ones included, and the tokens generated.
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens",
            "Number of prefill tokens processed.",
            [*names, "is_streaming"],
            registry=reg,
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            [*names, "is_streaming"],
            registry=reg,
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*names, "cache_source"],
            registry=reg,
        )
        self.requests = Counter(
            "sglang:num_requests", "Requests processed.", [*names, "is_streaming"], registry=reg
        )
        self.aborted = Counter(
            "sglang:num_aborted_requests", "Requests aborted.", names, registry=reg
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token (s).",
            [*names, "is_streaming"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Inter-token latency (s).",
            names,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request time per output token (s).",
            [*names, "is_streaming"],
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end latency (s).",
            [*names, "is_streaming"],
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.sim_kv_bytes = Counter(
            "pdkit_sim:kv_bytes_moved",
            "KV bytes that crossed Mooncake (scaled by PDKIT_SIM_KV_SCALE).",
            names,
            registry=reg,
        )
        self.sim_lag = gauge(
            "pdkit_sim:step_timer_lag_seconds",
            "Mean lateness of the emulator's step timers (wall s).",
        )
        self.sim_lag_max = gauge(
            "pdkit_sim:step_timer_lag_max_seconds",
            "Worst lateness of the emulator's step timers (wall s).",
        )
        # HiCache: prompt tokens by cache source, as SGLang 0.5.23 counts them
        # (observability/metrics_collector.py: device, host, storage).
        self.pool_up = Gauge(
            "pdkit_sim:kv_pool_up",
            "1 while the KV pool (HiCache L3, Mooncake Store) answers, 0 while it is skipped.",
            names,
            registry=reg,
        )
        self.pool_failures = Counter(
            "pdkit_sim:kv_pool_failures",
            "Mooncake Store calls that failed or timed out.",
            names,
            registry=reg,
        )
        self._counted = {
            "bootstrap": 0,
            "transfer": 0,
            "kv_bytes": 0,
            "device": 0,
            "storage": 0,
            "pool_failures": 0,
        }
        # Listed from the start with its label, as SGLang lists it.
        self.cached_tokens.labels(**self.labels, cache_source="device")

    def _rank_labels(self, dp_rank: int) -> dict[str, str]:
        return {
            **self.labels,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
            "dp_rank": str(dp_rank),
        }

    def observe(self, state: RequestState) -> None:
        """Record a finished request."""
        streaming = str(state.inp.stream).lower()
        labels = self.labels
        self.requests.labels(**labels, is_streaming=streaming).inc()
        self.prompt_tokens.labels(**labels, is_streaming=streaming).inc(state.inp.prompt_len)
        self.generation_tokens.labels(**labels, is_streaming=streaming).inc(len(state.output_ids))
        if state.finish is not None and state.finish.kind == "abort":
            self.aborted.labels(**labels).inc()
            return
        if state.first_token_at is not None:
            self.ttft.labels(**labels, is_streaming=streaming).observe(
                state.first_token_at - state.arrival
            )
        times = state.token_times
        itl = self.itl.labels(**labels)
        for a, b in itertools.pairwise(times):
            itl.observe(b - a)
        if len(times) > 1:
            self.tpot.labels(**labels, is_streaming=streaming).observe(
                (times[-1] - times[0]) / (len(times) - 1)
            )
        self.e2e.labels(**labels, is_streaming=streaming).observe(state.e2e_latency())

    def observe_transfer(self, record: TransferRecord) -> None:
        """Record one KV hand-off (called by the engine)."""
        lab = self._rank_labels(record.dp_rank)
        if record.side == "prefill":
            self.kv_latency.labels(**lab).observe(record.latency_ms)
            self.kv_speed.labels(**lab).observe(record.speed_gb_s)
            self.kv_total_mb.labels(**lab).observe(record.total_mb)
        else:
            self.kv_bootstrap_ms.labels(**lab).observe(record.bootstrap_ms)
            self.kv_alloc_ms.labels(**lab).observe(record.alloc_ms)

    def _bump(self, counter: Counter, key: str, total: int) -> None:
        delta = total - self._counted[key]
        if delta > 0:
            counter.labels(**self.labels).inc(delta)
            self._counted[key] = total

    def render(self) -> bytes:
        """The Prometheus text exposition, gauges refreshed from the engine."""
        e = self.engine
        throughput = e.gen_throughput()
        computed = sum(r.stats.prompt_tokens for r in e.ranks)
        cached = e.caching.stats.device_tokens + e.caching.stats.storage_tokens
        hit_rate = cached / (cached + computed) if cached + computed else 0.0
        for i, rank in enumerate(e.ranks):
            lab = self._rank_labels(i)
            pool = rank.pool
            self.running.labels(**lab).set(rank.num_running())
            self.queued.labels(**lab).set(rank.num_queued())
            self.token_usage.labels(**lab).set(round(pool.usage(), 4))
            self.used_tokens.labels(**lab).set(pool.used_pages * pool.page_size)
            self.max_tokens.labels(**lab).set(pool.capacity_tokens)
            self.throughput.labels(**lab).set(round(throughput / len(e.ranks), 3))
            self.cache_hit.labels(**lab).set(round(hit_rate, 4))
            self.retracted.labels(**lab).set(len(rank.retracted))
            self.bootstrap_q.labels(**lab).set(e.pd.bootstrap_queue if i == 0 else 0)
            self.inflight_q.labels(**lab).set(len(rank.inflight))
            self.prealloc_q.labels(**lab).set(len(rank.prealloc))
            self.transfer_q.labels(**lab).set(len(rank.transfer))
            self.sim_lag.labels(**lab).set(e.clock.lag.mean_s)
            self.sim_lag_max.labels(**lab).set(e.clock.lag.max_s)
        self._bump(self.bootstrap_failed, "bootstrap", e.pd.bootstrap_failed)
        self._bump(self.transfer_failed, "transfer", e.pd.transfer_failed)
        self._bump(self.sim_kv_bytes, "kv_bytes", e.pd.kv_bytes_moved)
        for source, total in (
            ("device", e.caching.stats.device_tokens),
            ("storage", e.caching.stats.storage_tokens),
        ):
            delta = total - self._counted[source]
            if delta > 0:
                self.cached_tokens.labels(**self.labels, cache_source=source).inc(delta)
                self._counted[source] = total
        if e.caching.pool is not None:
            self.pool_up.labels(**self.labels).set(1 if e.caching.pool.up else 0)
            self._bump(self.pool_failures, "pool_failures", e.caching.pool.stats.failures)
        return generate_latest(self.registry)


def _waiting_uncached(engine: Engine, rank_index: int) -> int:
    """A rank's waiting prompt tokens still to compute. One not matched yet (the radix cache
    is matched at admission) counts its prompt times the rank's recent miss rate, as SGLang
    0.5.23 estimates it; one whose prefix came from HiCache counts what is left."""
    rank = engine.ranks[rank_index]
    cache = engine.caching.caches[rank_index] if engine.caching.caches is not None else None
    miss = 1.0 - cache.recent_hit_rate(engine.clock.now()) if cache is not None else 1.0
    return sum(
        int(s.target * miss) if s.on_admit is not None else s.target - s.computed
        for s in rank.waiting
    )


def loads(engine: Engine, include: set[str] | None, dp_rank: int | None) -> dict[str, Any]:
    """The ``/v1/loads`` JSON: one entry per DP rank (SGLang's LoadSnapshot fields)."""
    valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
    if include is not None and not include <= valid:
        raise ValueError(
            f"Invalid include sections: {include - valid}. Valid options: {sorted(valid)}"
        )
    everything = include is None or "all" in include
    throughput = engine.gen_throughput() / len(engine.ranks)
    out = []
    for i, rank in enumerate(engine.ranks):
        if dp_rank is not None and i != dp_rank:
            continue
        pool = rank.pool
        used = pool.used_pages * pool.page_size
        waiting_tokens = _waiting_uncached(engine, i)
        load: dict[str, Any] = {
            "timestamp": datetime.now(UTC).timestamp(),
            "dp_rank": i,
            "num_running_reqs": rank.num_running(),
            "num_waiting_reqs": rank.num_queued(),
            "num_waiting_uncached_tokens": waiting_tokens,
            "num_used_tokens": used,
            "num_total_tokens": used,
            "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": pool.capacity_tokens,
            "max_running_requests": rank.max_running,
            "token_usage": round(pool.usage(), 4),
            "gen_throughput": round(throughput, 3),
            "cache_hit_rate": 0.0,
            "utilization": round(min(1.0, rank.num_running() / rank.max_running), 4),
            "total_prefill_uncached_tokens": rank.stats.prompt_tokens,
            "total_prefill_busy_us": int(rank.stats.busy_s * 1e6),
        }
        if everything or "memory" in include:  # type: ignore[operator]
            load["memory"] = {
                "weight_gb": round(engine.timing.weight_bytes_per_gpu() / 1e9, 3),
                "kv_cache_gb": round(
                    pool.capacity_tokens * engine.timing.kv_bytes_per_token_per_gpu / 1e9, 3
                ),
                "graph_gb": 0.0,
                "token_capacity": pool.capacity_tokens,
            }
        if everything or "disagg" in include:  # type: ignore[operator]
            load["disaggregation"] = {
                "mode": engine.mode.value,
                "prefill_bootstrap_queue_reqs": engine.pd.bootstrap_queue if i == 0 else 0,
                "prefill_inflight_queue_reqs": len(rank.inflight),
                "decode_prealloc_queue_reqs": len(rank.prealloc),
                "decode_transfer_queue_reqs": len(rank.transfer),
                "decode_retracted_queue_reqs": len(rank.retracted),
                "kv_transfer_speed_gb_s": round(engine.pd.last_speed_gb_s, 3),
                "kv_transfer_latency_ms": round(engine.pd.last_latency_ms, 3),
            }
        if everything or "queues" in include:  # type: ignore[operator]
            load["queues"] = {
                "waiting": len(rank.waiting) + len(rank.prealloc),
                "grammar": 0,
                "paused": 0,
                "retracted": len(rank.retracted),
                "prealloc_ready": len(rank.ready),
            }
        out.append(load)
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": f"pdkit-sim {engine.gpu.name}",
        "num_accelerators": engine.gpus,
        "loads": out,
    }


def loads_prometheus(data: dict[str, Any]) -> str:
    """SGLang's ``/v1/loads?format=prometheus`` text."""
    prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in data["loads"]:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub, v in value.items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((rank, v))
            elif isinstance(value, int | float) and not isinstance(value, bool):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f'{name}{{dp_rank="{r}"}} {v}' for r, v in values)
    return "\n".join(lines) + "\n"
