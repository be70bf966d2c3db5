"""Virtual-time sweeps: fast, and showing why PD disaggregation pays (DistServe's ordering)."""

from __future__ import annotations

from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.sweep import Cluster, InstanceConfig, Slo, goodput, poisson_workload, run_rate

CFG = InstanceConfig(resolve_model("Llama-2-13b"), gpu_spec("A100-80G"))
SLO = Slo(ttft=0.4, tpot=0.04, attainment=0.9)


def test_a_thousand_requests_all_finish_with_their_full_output():
    # Its wall time is reported by tools/bench_sim.py, not asserted here (shared machines).
    outcomes = Cluster("colocated", CFG).run(poisson_workload(4.0, 1000, 512, 64))
    assert len(outcomes) == 1000
    assert all(o.tokens == 64 and o.finish is not None for o in outcomes)


def test_colocated_tpot_grows_with_load_but_decode_only_stays_flat():
    low = run_rate(Cluster("colocated", CFG), 1.0, 512, 64, requests=300, slo=SLO)
    high = run_rate(Cluster("colocated", CFG), 5.0, 512, 64, requests=300, slo=SLO)
    assert high.p90_tpot > 1.5 * low.p90_tpot  # prefills stall the running decodes
    d_low = run_rate(Cluster("decode-only", CFG, prefill=0), 1.0, 512, 64, requests=300, slo=SLO)
    d_high = run_rate(Cluster("decode-only", CFG, prefill=0), 5.0, 512, 64, requests=300, slo=SLO)
    assert d_high.p90_tpot < 1.2 * d_low.p90_tpot


def test_disaggregation_beats_colocation_per_gpu():
    colocated = goodput(Cluster("colocated", CFG), 512, 64, slo=SLO, requests=400)
    two_one = goodput(Cluster("pd", CFG, prefill=2, decode=1), 512, 64, slo=SLO, requests=400)
    assert two_one / 3 > 1.3 * colocated


def test_pd_requests_wait_for_kv_transfer():
    out = Cluster("pd", CFG).run(poisson_workload(0.5, 5, 512, 8))
    solo = Cluster("colocated", CFG).run(poisson_workload(0.5, 5, 512, 8))
    assert all(p.ttft > c.ttft for p, c in zip(out, solo, strict=True))
