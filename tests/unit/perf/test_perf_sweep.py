"""Virtual-time sweeps: fast, and showing why PD disaggregation pays (DistServe's ordering)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.sweep import goodput, percentile, queue_growing, run_rate, ttft_trend
from kit.perf.workload import Request, fixed_poisson, poisson_arrivals, poisson_workload
from kit.topology.schema import SLO

CFG = InstanceConfig(resolve_model("Llama-2-13b"), gpu_spec("A100-80G"))
DISTSERVE_SLO = SLO(ttft_ms=400, tpot_ms=40, attainment=0.9)
COLOCATED = Cluster(colocated=Instances(CFG))
DECODE_ONLY = Cluster(decode=Instances(CFG))


def test_a_thousand_requests_all_finish_with_their_full_output():
    # Its wall time is reported by benchmarks/bench_sim.py, not asserted here (shared machines).
    outcomes = COLOCATED.run(poisson_workload(4.0, 1000, 512, 64))
    assert len(outcomes) == 1000
    assert all(o.tokens == 64 and o.finish is not None for o in outcomes)


def test_colocated_tpot_grows_with_load_but_decode_only_stays_flat():
    work = fixed_poisson(512, 64, requests=300)
    low = run_rate(COLOCATED, 1.0, work, slo=DISTSERVE_SLO)
    high = run_rate(COLOCATED, 5.0, work, slo=DISTSERVE_SLO)
    assert high.p90_tpot_ms > 1.5 * low.p90_tpot_ms  # prefills stall the running decodes
    d_low = run_rate(DECODE_ONLY, 1.0, work, slo=DISTSERVE_SLO)
    d_high = run_rate(DECODE_ONLY, 5.0, work, slo=DISTSERVE_SLO)
    assert d_high.p90_tpot_ms < 1.2 * d_low.p90_tpot_ms


def test_disaggregation_beats_colocation_per_gpu():
    work = fixed_poisson(512, 64, requests=400)
    colocated = goodput(COLOCATED, work, slo=DISTSERVE_SLO)
    two_one = Cluster(prefill=Instances(CFG, 2), decode=Instances(CFG))
    assert two_one.gpus == 3
    assert goodput(two_one, work, slo=DISTSERVE_SLO) / 3 > 1.3 * colocated


def test_pd_requests_wait_for_kv_transfer():
    out = Cluster(prefill=Instances(CFG), decode=Instances(CFG)).run(
        poisson_workload(0.5, 5, 512, 8)
    )
    solo = COLOCATED.run(poisson_workload(0.5, 5, 512, 8))
    assert all(p.ttft_s > c.ttft_s for p, c in zip(out, solo, strict=True))


def test_summaries_are_in_milliseconds_and_a_tighter_slo_attains_less():
    work = fixed_poisson(512, 64, requests=200)
    loose = run_rate(COLOCATED, 3.0, work, slo=DISTSERVE_SLO)
    assert 50 < loose.p90_ttft_ms < 400 and 20 < loose.p90_tpot_ms < 40
    assert loose.p50_tpot_ms <= loose.p90_tpot_ms
    tight = run_rate(COLOCATED, 3.0, work, slo=SLO(ttft_ms=loose.p50_ttft_ms, tpot_ms=1000))
    assert loose.attainment == 1.0 and 0.4 < tight.attainment < 0.6


def test_two_colocated_instances_serve_about_twice_the_goodput():
    work = fixed_poisson(512, 64, requests=400)
    one = goodput(COLOCATED, work, slo=DISTSERVE_SLO)
    two = Cluster(colocated=Instances(CFG, 2))
    assert two.gpus == 2
    assert goodput(two, work, slo=DISTSERVE_SLO) == pytest.approx(2 * one, rel=0.15)


def test_prefill_and_decode_can_be_launched_with_different_tp():
    big = resolve_model("Llama-3.1-70B")
    h100 = gpu_spec("H100-SXM")
    cluster = Cluster(
        prefill=Instances(InstanceConfig(big, h100, tp=4), 2),
        decode=Instances(InstanceConfig(big, h100, tp=8)),
    )
    assert cluster.kind == "pd" and cluster.gpus == 16
    out = cluster.run(poisson_workload(2.0, 20, 1024, 16))
    assert all(o.tokens == 16 for o in out)
    # A decode of TP 8 steps faster than one of TP 4.
    narrow = replace(cluster, decode=Instances(InstanceConfig(big, h100, tp=4)))
    narrow_out = narrow.run(poisson_workload(2.0, 20, 1024, 16))
    assert max(o.tpot_s for o in out) < min(o.tpot_s for o in narrow_out)


def test_a_workload_factory_carries_any_length_mix():
    mixed = [(128, 16), (4096, 16)] * 50

    def work(rate: float) -> list[Request]:
        return poisson_arrivals(rate, mixed, seed=1)

    summary = run_rate(COLOCATED, 1.0, work, slo=DISTSERVE_SLO)
    assert summary.requests == 100
    out = COLOCATED.run(work(1.0))
    short = [o.ttft_s for o in out if o.request.prompt_len == 128]
    long = [o.ttft_s for o in out if o.request.prompt_len == 4096]
    # A 4096-token prompt takes far longer to prefill (medians: queueing affects both).
    assert percentile(short, 0.5) * 10 < percentile(long, 0.5)


def test_a_cluster_says_what_it_runs():
    assert (COLOCATED.kind, DECODE_ONLY.kind) == ("colocated", "decode-only")
    assert Cluster(prefill=Instances(CFG)).kind == "prefill-only"
    with pytest.raises(ValueError, match="not both"):
        Cluster(colocated=Instances(CFG), decode=Instances(CFG))
    with pytest.raises(ValueError, match="needs"):
        Cluster()
    with pytest.raises(ValueError, match="count must be >= 1"):
        Instances(CFG, 0)


def test_a_model_that_does_not_fit_says_so():
    big = InstanceConfig(resolve_model("Llama-3.1-70B"), gpu_spec("A100-80G"))
    assert not big.fits() and replace(big, tp=4).fits()
    with pytest.raises(ValueError, match=r"does not fit on 1 x A100-80G.*raise tp"):
        Cluster(colocated=Instances(big)).run(poisson_workload(1.0, 1, 16, 1))


def test_a_short_run_above_the_sustained_rate_attains_but_its_growing_queue_misses():
    # 2P1D serves 20 req/s steadily (2000 requests); 100 requests at 28 req/s all attain the
    # SLO because the first find an empty queue, but TTFT climbs through the run.
    pd = Cluster(prefill=Instances(CFG, 2), decode=Instances(CFG))
    short = fixed_poisson(512, 64, requests=100)
    above = run_rate(pd, 28.0, short, slo=DISTSERVE_SLO)
    assert above.attainment >= DISTSERVE_SLO.attainment and above.growing
    assert not above.meets(DISTSERVE_SLO)
    steady = run_rate(pd, 18.0, short, slo=DISTSERVE_SLO)
    assert steady.meets(DISTSERVE_SLO) and not steady.growing
    assert goodput(pd, short, slo=DISTSERVE_SLO) < 28.0


@pytest.mark.parametrize(
    ("trend", "growing"),
    [
        ((100.0, 180.0), False),  # slower, not doubled
        ((100.0, 250.0), True),  # doubled, and up by more than a tenth of the 400 ms objective
        ((5.0, 30.0), False),  # six times, but 25 ms: noise at a low TTFT
        (None, False),  # too few answers to tell
    ],
)
def test_a_growing_queue_is_a_doubled_ttft_that_also_matters_against_the_objective(trend, growing):
    assert queue_growing(trend, DISTSERVE_SLO) is growing


def test_the_trend_is_the_median_of_the_first_and_last_thirds_of_the_answered():
    ttfts = [10.0] * 3 + [float("inf")] + [50.0] * 3 + [90.0] * 3
    assert ttft_trend(ttfts) == (10.0, 90.0)
    assert ttft_trend([10.0] * 8) is None
