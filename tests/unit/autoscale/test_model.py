"""kit/perf for a pool: the split it prefers follows the mix, and its corrections follow what
was observed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kit.autoscale.decide import Mix, Split
from kit.autoscale.model import Observed, PoolModel
from kit.bench.predict import plan_cluster
from kit.perf.timing import Efficiency
from kit.plan.resolve import resolve
from kit.topology.load import parse_topology, read_topology_text
from tests.conftest import REPO

LOCAL = REPO / "topologies" / "local.yaml"
SPLITS = [Split(p, 6 - p) for p in range(1, 6)]


@pytest.fixture(scope="module")
def model() -> PoolModel:
    cluster, speed = plan_cluster(resolve(LOCAL))
    topology, _ = parse_topology(read_topology_text(LOCAL))
    assert cluster.prefill is not None and cluster.decode is not None
    return PoolModel(cluster.prefill.config, cluster.decode.config, topology.slo, topology, speed)


def best(model: PoolModel, mix: Mix) -> Split:
    rated = model.goodputs(SPLITS, mix)
    return max(rated, key=lambda s: rated[s])


def test_long_answers_want_decodes_and_long_prompts_want_prefills(model):
    chat = best(model, Mix(10, 200, 600))
    summary = best(model, Mix(10, 2000, 60))
    assert chat.decode > chat.prefill
    assert summary.prefill > summary.decode
    assert model.bottleneck(Split(3, 3), Mix(10, 200, 600)) == "decode"


def test_the_fit_moves_the_factors_towards_what_was_observed(model):
    fresh = replace(model, efficiency=Efficiency(), _capacities={})
    mix = Mix(40, 300, 100)
    # What a deployment at half the modelled compute would show.
    slow = fresh.replay(Split(3, 3), mix, 80, Efficiency(compute=0.3, memory=0.7))
    corrected = fresh.correct(Split(3, 3), mix, Observed(slow, 1.0, 80))
    assert corrected.fitted
    assert corrected.error_after < corrected.error_before
    assert fresh.efficiency.compute < 0.45
    assert fresh.efficiency.memory == pytest.approx(0.7, rel=0.25)


def test_a_later_short_interval_moves_the_factors_only_part_of_the_way(model):
    """One short interval's fit is noisy: after the first fit, 20 requests that say compute
    0.6 move it from about 0.3 towards 0.6, not all the way."""
    fresh = replace(model, efficiency=Efficiency(), _capacities={})
    mix = Mix(8, 2000, 50)
    slow = fresh.replay(Split(3, 3), mix, 80, Efficiency(compute=0.3, memory=0.7))
    assert fresh.correct(Split(3, 3), mix, Observed(slow, 1.0, 80)).fitted
    first = fresh.efficiency.compute
    assert first == pytest.approx(0.3, rel=0.15)
    faster = fresh.replay(Split(3, 3), mix, 20, Efficiency(compute=0.6, memory=0.7))
    corrected = fresh.correct(Split(3, 3), mix, Observed(faster, 1.0, 20))
    assert corrected.fitted and corrected.error_after < corrected.error_before
    assert first * 1.05 < fresh.efficiency.compute < 0.5


def test_an_overloaded_interval_is_not_fitted(model):
    fresh = replace(model, efficiency=Efficiency(), _capacities={})
    mix = Mix(40, 300, 100)
    slow = fresh.replay(Split(3, 3), mix, 80, Efficiency(compute=0.3, memory=0.7))
    corrected = fresh.correct(Split(3, 3), mix, Observed(slow, 0.2, 80))
    assert not corrected.fitted and fresh.efficiency == Efficiency()


def test_latency_the_gpus_do_not_explain_is_not_fitted_into_their_efficiency(model):
    """Short prompts: the TTFT a deployment shows is mostly HTTP and router time; taking it for
    slow GPUs would make every long prefill look slow."""
    fresh = replace(model, efficiency=Efficiency(), _capacities={})
    mix = Mix(20, 128, 64)
    modelled = fresh.replay(Split(3, 3), mix, 80, Efficiency())
    overhead = replace(
        modelled,
        p50_ttft_ms=modelled.p50_ttft_ms * 10,
        p90_ttft_ms=modelled.p90_ttft_ms * 10,
    )
    fresh.correct(Split(3, 3), mix, Observed(overhead, 1.0, 80))
    assert fresh.efficiency.compute == Efficiency().compute
