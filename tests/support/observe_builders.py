"""Answers as workers and routers give them, for the observe unit tests (no network)."""

from __future__ import annotations

import json
import time

from kit.observe.probe import Fetched, Round, RouterAnswers, WorkerAnswers
from kit.observe.targets import Expected, RouterTarget, Targets, WorkerTarget
from kit.topology.schema import SLO

URL = "http://127.0.0.1:30000"
NOW = 1_800_000_000.0


def worker_target(
    role: str = "prefill", url: str = URL, instance: int = 0, **expected: object
) -> WorkerTarget:
    fields: dict[str, object] = {
        "served_model": "llama-3.1-8b",
        "mode": role,
        "engine": "sim",
        "sglang_version": "0.5.23",
        "bootstrap_port": 8998 if role == "prefill" else None,
        "tp_size": 1,
    }
    fields.update(expected)
    return WorkerTarget(
        name=f"{role}-{instance}",
        role=role,  # type: ignore[arg-type]
        instance=instance,
        host="gpu-a",
        url=url,
        nnodes=1,
        expected=Expected(**fields),  # type: ignore[arg-type]
    )


def ok(path: str, body: object, status: int = 200) -> Fetched:
    text = body if isinstance(body, str) else json.dumps(body)
    return Fetched(URL + path, status, text, seconds=0.002, at=time.monotonic())


def failed(path: str, kind: str, detail: str) -> Fetched:
    return Fetched(URL + path, failure=kind, detail=detail)  # type: ignore[arg-type]


def server_info(role: str = "prefill", **changes: object) -> dict[str, object]:
    info: dict[str, object] = {
        "model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "served_model_name": "llama-3.1-8b",
        "disaggregation_mode": role,
        "disaggregation_bootstrap_port": 8998,
        "tp_size": 1,
        "version": "0.5.23",
        "engine": "pdkit-sim",
        "frontend": "python",
        # SGLang's startup_time: phase durations; the sim's start time is under `sim`
        "startup_time": {
            "load_weight": 1.0,
            "kv_cache_allocation": 0.0,
            "scheduler_e2e": 1.0,
            "cuda_graph": {},
            "tokenizer_e2e": 1.0,
        },
        "sim": {"started_at": NOW - 125},
        "internal_states": [{}],
    }
    info.update(changes)
    return info


def loads(role: str = "prefill", ranks: int = 2) -> dict[str, object]:
    entries = []
    for rank in range(ranks):
        disagg = {
            "mode": role,
            "prefill_bootstrap_queue_reqs": 1 + rank,
            "prefill_inflight_queue_reqs": 2,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "kv_transfer_latency_ms": 4.0 + rank,
        }
        entries.append(
            {
                "dp_rank": rank,
                "num_running_reqs": 3,
                "num_waiting_reqs": 1 + rank,
                "token_usage": 0.25 + rank / 10,
                "gen_throughput": 100.0,
                "disaggregation": disagg,
            }
        )
    return {"version": "0.5.23", "loads": entries}


def metrics_page(transfers: int = 10, total_ms: float = 42.0, under_5ms: int = 8) -> str:
    return f"""\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="prefill",tp_rank="0"}} 9.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="prefill",tp_rank="0"}} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="prefill",tp_rank="0"}} 0.5
# TYPE sglang:num_prefill_bootstrap_queue_reqs gauge
sglang:num_prefill_bootstrap_queue_reqs{{engine_type="prefill",tp_rank="0"}} 7.0
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{{engine_type="prefill",tp_rank="0"}} 3.0
# TYPE sglang:num_bootstrap_failed_reqs_total counter
sglang:num_bootstrap_failed_reqs_total{{engine_type="prefill",tp_rank="0"}} 1.0
# TYPE sglang:kv_transfer_latency_ms histogram
sglang:kv_transfer_latency_ms_bucket{{engine_type="prefill",le="5.0",tp_rank="0"}} {under_5ms}
sglang:kv_transfer_latency_ms_bucket{{engine_type="prefill",le="10.0",tp_rank="0"}} {transfers}
sglang:kv_transfer_latency_ms_bucket{{engine_type="prefill",le="+Inf",tp_rank="0"}} {transfers}
sglang:kv_transfer_latency_ms_sum{{engine_type="prefill",tp_rank="0"}} {total_ms}
sglang:kv_transfer_latency_ms_count{{engine_type="prefill",tp_rank="0"}} {transfers}
"""


METRICS = metrics_page()


def worker_answers(
    role: str = "prefill",
    *,
    info=None,
    load=None,
    metrics=METRICS,
    health=None,
    url=URL,
    instance=0,
    **exp,
):
    return WorkerAnswers(
        worker_target(role, url, instance, **exp),
        health or ok("/health", ""),
        ok("/server_info", server_info(role) if info is None else info),
        ok("/v1/loads?include=all", loads(role) if load is None else load),
        ok("/metrics", metrics) if isinstance(metrics, str) else metrics,
    )


P0, P1, D0 = "http://10.0.0.1:30000", "http://10.0.0.1:30001", "http://10.0.0.2:30100"


def router_target(kind: str = "pdkit") -> RouterTarget:
    metrics = "http://10.0.0.1:29000/metrics" if kind == "smg" else "http://10.0.0.1:8000/metrics"
    return RouterTarget("router", kind, "a", "http://10.0.0.1:8000", metrics, None)  # type: ignore[arg-type]


def router_got(path: str, body: object, status: int = 200, at: float = 100.0) -> Fetched:
    text = body if isinstance(body, str) else json.dumps(body)
    return Fetched("http://10.0.0.1:8000" + path, status, text, at=at)


def pdkit_metrics(
    requests: int = 40, healthy: dict[str, int] | None = None, drain: int = 0, slow: int = 0
) -> str:
    """pdkit's page: 40 first tokens (36 within 400 ms), plus `slow` more in (0.4, 0.8] s."""
    healthy = healthy if healthy is not None else {P0: 1, P1: 1, D0: 1}
    role = {P0: "prefill", P1: "prefill", D0: "decode"}
    lines = [
        "# TYPE pdkit_lb_requests_total counter",
        f'pdkit_lb_requests_total{{route="/generate",status="200"}} {requests - 2}',
        'pdkit_lb_requests_total{route="/generate",status="502"} 2',
        'pdkit_lb_requests_total{route="/readiness",status="200"} 77',  # probes do not count
        "# TYPE pdkit_lb_inflight_requests gauge",
        "pdkit_lb_inflight_requests 3",
        "# TYPE pdkit_lb_draining gauge",
        f"pdkit_lb_draining {drain}",
        "# TYPE pdkit_lb_worker_healthy gauge",
        *(
            f'pdkit_lb_worker_healthy{{worker="{u}",role="{role[u]}"}} {v}'
            for u, v in healthy.items()
        ),
        "# TYPE pdkit_lb_worker_out gauge",
        *(
            f'pdkit_lb_worker_out{{worker="{u}",role="{role[u]}",reason="health_check"}} 1'
            for u, v in healthy.items()
            if not v
        ),
        "# TYPE pdkit_lb_time_to_first_token_seconds histogram",
    ]
    ttft = (("0.1", 10), ("0.2", 20), ("0.4", 36), ("0.8", 40 + slow), ("+Inf", 40 + slow))
    for bound, count in ttft:
        lines.append(
            f'pdkit_lb_time_to_first_token_seconds_bucket{{route="/generate",le="{bound}"}} {count}'
        )
    lines += [
        f'pdkit_lb_time_to_first_token_seconds_sum{{route="/generate"}} {9.0 + 0.6 * slow}',
        f'pdkit_lb_time_to_first_token_seconds_count{{route="/generate"}} {40 + slow}',
        "# TYPE pdkit_lb_inter_token_latency_seconds histogram",
    ]
    for bound, count in (("0.02", 500), ("0.04", 900), ("0.08", 1000), ("+Inf", 1000)):
        lines.append(
            f'pdkit_lb_inter_token_latency_seconds_bucket{{route="/generate",le="{bound}"}} {count}'
        )
    lines += [
        'pdkit_lb_inter_token_latency_seconds_sum{route="/generate"} 25.0',
        'pdkit_lb_inter_token_latency_seconds_count{route="/generate"} 1000',
    ]
    return "\n".join(lines) + "\n"


def pdkit_answers(*, ready: bool = True, metrics: str | None = None, health=None, at=100.0):
    counts = {"prefill": {"healthy": 2, "total": 2}, "decode": {"healthy": 1, "total": 1}}
    return RouterAnswers(
        router_target("pdkit"),
        health or router_got("/health", {"status": "ok"}),
        router_got(
            "/readiness",
            {"ready": ready, "draining": False, **counts, "out": []},
            200 if ready else 503,
        ),
        router_got("/workers", {"error": {"message": "admin key required"}}, 403),
        router_got("/metrics", pdkit_metrics() if metrics is None else metrics, at=at),
    )


SMG_WORKERS = {
    "workers": [
        {"url": P0, "worker_type": "prefill", "is_healthy": True, "bootstrap_port": 8998},
        {"url": D0, "worker_type": "decode", "is_healthy": False, "status": "failed"},
    ],
    "total": 2,
    "stats": {"prefill_count": 1, "decode_count": 1, "regular_count": 0},
}
SMG_LABELS = 'router_type="http",backend_type="pd",connection_mode="http",model="m"'
SMG_METRICS = f"""\
# TYPE smg_router_requests_total counter
smg_router_requests_total{{{SMG_LABELS},endpoint="chat",streaming="true"}} 8
smg_router_requests_total{{{SMG_LABELS},endpoint="chat",streaming="false"}} 4
# TYPE smg_http_requests_total counter
smg_http_requests_total{{method="GET",path="/readiness"}} 90
# TYPE smg_pd_ttft_seconds histogram
smg_pd_ttft_seconds_bucket{{backend_type="pd",model="m",runtime="sglang",le="0.5"}} 12
smg_pd_ttft_seconds_bucket{{backend_type="pd",model="m",runtime="sglang",le="+Inf"}} 12
smg_pd_ttft_seconds_sum{{backend_type="pd",model="m",runtime="sglang"}} 2.4
smg_pd_ttft_seconds_count{{backend_type="pd",model="m",runtime="sglang"}} 12
"""


def cluster(*, p1=None, d0=None, router=None):
    """Two prefills and a decode behind pdkit's router, all healthy unless replaced."""
    workers = (
        worker_answers("prefill", url=P0, instance=0),
        p1 or worker_answers("prefill", url=P1, instance=1),
        d0 or worker_answers("decode", url=D0, instance=0, info=server_info("decode")),
    )
    router = router or pdkit_answers()
    targets = Targets("demo", tuple(w.target for w in workers), router.target, SLO())
    return targets, Round(workers, router, taken_at=NOW, seconds=0.05)
