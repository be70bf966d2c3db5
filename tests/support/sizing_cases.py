"""Sizing questions the tests and `make bench-size` share: DistServe's Fig. 1 (Llama-2-13B on
A100-80G, 512 input / 64 output tokens, Poisson arrivals, TTFT 400 ms and TPOT 40 ms for 90% of
requests) on a number of GPUs; and the records a bench run on a sim deployment would leave, made
by the performance model (what calibration fits)."""

from __future__ import annotations

from typing import Any

from kit.bench.records import RequestRecord
from kit.perf.cluster import Cluster
from kit.perf.workload import WorkloadSpec
from kit.sizing.problem import SizingProblem, generic_base, make_problem
from kit.topology.schema import SLO

DISTSERVE_MODEL = "meta-llama/Llama-2-13b-hf"
DISTSERVE_GPU = "A100-80G"
DISTSERVE_SLO = SLO(ttft_ms=400, tpot_ms=40, attainment=0.9)


def distserve(gpus: int, **changes: Any) -> SizingProblem:
    """DistServe's question on `gpus` GPUs (generic 8-GPU hosts); `changes` override
    `make_problem`'s arguments."""
    options: dict[str, Any] = {
        "base": generic_base("distserve", DISTSERVE_MODEL, DISTSERVE_GPU, gpus, 8),
        "model_path": DISTSERVE_MODEL,
        "gpu": DISTSERVE_GPU,
        "slo": DISTSERVE_SLO,
        "workload": WorkloadSpec(count=200),
        **changes,
    }
    return make_problem(**options)


def synthetic_records(cluster: Cluster, rates: list[float], speed: float) -> list[RequestRecord]:
    """What `pdkit bench` would record on a sim deployment of `cluster` at `speed`, each
    rate (wall requests/s) a point of 120 requests, the first 10 warm-up."""
    records = []
    for rate in rates:
        requests = WorkloadSpec(count=120, seed=3).requests(rate / speed)
        for i, (request, outcome) in enumerate(zip(requests, cluster.run(requests), strict=True)):
            wall = request.arrival / speed
            records.append(
                RequestRecord(
                    index=i,
                    rate=rate,
                    warmup=i < 10,
                    input_tokens=request.prompt_len,
                    output_tokens=request.output_len,
                    scheduled_s=wall,
                    sent_s=wall,
                    status=200,
                    ok=True,
                    ttft_ms=outcome.ttft_s * 1000 / speed,
                    tpot_ms=outcome.tpot_s * 1000 / speed,
                )
            )
    return records
