"""Prometheus text: parsing with prometheus_client, histogram quantiles and SLO shares, rates."""

from __future__ import annotations

import math

import pytest

from kit.errors import ProbeError
from kit.observe.prom import Histogram, increase, parse_metrics, rate, select_families

PAGE = """\
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m",tp_rank="0"} 10.0
sglang:time_to_first_token_seconds_bucket{le="0.2",model_name="m",tp_rank="0"} 30.0
sglang:time_to_first_token_seconds_bucket{le="0.4",model_name="m",tp_rank="0"} 80.0
sglang:time_to_first_token_seconds_bucket{le="0.8",model_name="m",tp_rank="0"} 100.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m",tp_rank="0"} 100.0
sglang:time_to_first_token_seconds_sum{model_name="m",tp_rank="0"} 31.0
sglang:time_to_first_token_seconds_count{model_name="m",tp_rank="0"} 100.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="0",dp_rank="1"} 4.0
# TYPE sglang:num_transfer_failed_reqs_total counter
sglang:num_transfer_failed_reqs_total{model_name="m"} 2.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.5
"""


def hist(*buckets: tuple[float, float]) -> Histogram:
    return Histogram(buckets=tuple(buckets), count=buckets[-1][1], sum=0.0)


def test_sums_gauges_over_series_and_reads_counters_by_their_sample_name():
    metrics = parse_metrics(PAGE)
    assert metrics.total("sglang:num_running_reqs") == 7
    assert metrics.total("sglang:num_running_reqs", dp_rank="1") == 4
    assert metrics.maximum("sglang:num_running_reqs") == 4
    assert metrics.total("sglang:num_transfer_failed_reqs_total") == 2
    assert metrics.total("sglang:not_there") is None  # unknown is not zero


def test_histogram_quantiles_interpolate_like_prometheus():
    ttft = parse_metrics(PAGE).histogram("sglang:time_to_first_token_seconds")
    assert ttft is not None and ttft.count == 100 and ttft.mean == pytest.approx(0.31)
    # rank 50 falls in (0.2, 0.4] holding ranks 30..80: 0.2 + 0.2 * 20/50
    assert ttft.quantile(0.5) == pytest.approx(0.28)
    assert ttft.quantile(0.9) == pytest.approx(0.6)
    assert ttft.quantile(0.05) == pytest.approx(0.05)  # first bucket starts at 0


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound():
    assert hist((1.0, 5), (2.0, 5), (math.inf, 10)).quantile(0.99) == 2.0


def test_empty_histogram_has_no_quantile_and_no_share():
    empty = hist((1.0, 0), (math.inf, 0))
    assert empty.quantile(0.5) is None and empty.share_at_most(1.0) is None
    assert empty.mean is None


def test_share_within_a_limit_interpolates_inside_its_bucket():
    ttft = parse_metrics(PAGE).histogram("sglang:time_to_first_token_seconds")
    assert ttft is not None
    assert ttft.share_at_most(0.4) == pytest.approx(0.8)
    assert ttft.share_at_most(0.3) == pytest.approx(0.55)  # 30 + 50 * 0.5
    assert ttft.share_at_most(5.0) == pytest.approx(1.0)
    beyond = hist((1.0, 5), (math.inf, 10))
    assert beyond.share_at_most(3.0) == pytest.approx(0.5)  # the +Inf bucket counts as above


def test_since_gives_the_window_and_survives_a_restart():
    before = hist((0.1, 10), (0.4, 20), (math.inf, 20))
    after = hist((0.1, 10), (0.4, 50), (math.inf, 60))
    window = after.since(before)
    assert window.count == 40 and window.buckets == ((0.1, 0), (0.4, 30), (math.inf, 40))
    restarted = hist((0.1, 1), (0.4, 2), (math.inf, 2))
    assert restarted.since(before) is restarted
    assert after.since(None) is after


def test_histograms_are_summed_over_series_with_the_same_bounds():
    rank1 = "\n".join(
        line.replace('tp_rank="0"', 'tp_rank="1"')
        for line in PAGE.splitlines()
        if line.startswith("sglang:time_to_first_token_seconds")
    )
    ttft = parse_metrics(PAGE + rank1 + "\n").histogram("sglang:time_to_first_token_seconds")
    assert ttft is not None and ttft.count == 200 and ttft.quantile(0.5) == pytest.approx(0.28)
    only_rank1 = parse_metrics(PAGE + rank1 + "\n").histogram(
        "sglang:time_to_first_token_seconds", tp_rank="1"
    )
    assert only_rank1 is not None and only_rank1.count == 100


def test_select_families_keeps_only_what_status_reads():
    kept = select_families(PAGE, {"sglang:num_running_reqs", "sglang:time_to_first_token_seconds"})
    assert "cache_hit_rate" not in kept and "transfer_failed" not in kept
    metrics = parse_metrics(PAGE, {"sglang:num_transfer_failed_reqs_total"})
    assert metrics.total("sglang:num_transfer_failed_reqs_total") == 2
    assert metrics.total("sglang:num_running_reqs") is None


@pytest.mark.parametrize("families", [None, {"sglang:num_running_reqs"}])
def test_text_that_is_not_the_exposition_format_is_a_probe_error(families):
    with pytest.raises(ProbeError, match="not Prometheus text"):
        parse_metrics('{"detail": "not found"}', families)


def test_counter_rates_count_a_drop_as_a_restart():
    assert rate(130.0, 100.0, 2.0) == 15.0
    assert increase(5.0, 100.0) == 5.0
    assert rate(5.0, None, 2.0) is None and rate(None, 1.0, 2.0) is None
    assert rate(5.0, 1.0, 0.0) is None
