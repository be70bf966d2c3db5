"""Workloads as users write them: length distributions, arrivals, traces, reproducibility."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from kit.perf.workload import Arrivals, Lengths, WorkloadError, WorkloadSpec, read_trace


@pytest.mark.parametrize(
    ("text", "mean", "low", "high"),
    [
        ("512", 512, 512, 512),
        ("uniform:100,300", 200, 100, 300),
        ("normal:500,50", 500, 300, 700),
        ("lognormal:400,0.4", 400, 50, 3000),
    ],
)
def test_length_distributions_sample_what_they_say(text, mean, low, high):
    lengths = Lengths.parse(text)
    rng = random.Random(1)
    samples = [lengths.sample(rng) for _ in range(4000)]
    assert all(low <= s <= high for s in samples)
    assert statistics.mean(samples) == pytest.approx(mean, rel=0.05)
    assert lengths.mean == pytest.approx(mean)


def test_a_histogram_file_weights_its_lengths(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("# tokens weight\n100 3\n1000 1\n")
    lengths = Lengths.parse(f"hist:{path}")
    rng = random.Random(2)
    samples = [lengths.sample(rng) for _ in range(4000)]
    assert set(samples) == {100, 1000}
    assert samples.count(100) / len(samples) == pytest.approx(0.75, abs=0.03)
    assert lengths.mean == pytest.approx(325)


@pytest.mark.parametrize("text", ["0", "-3", "uniform:9,2", "normal:x,1", "zipf:1", "hist:/nope"])
def test_bad_lengths_name_the_option_and_the_forms(text):
    with pytest.raises(WorkloadError, match="--input-len") as info:
        Lengths.parse(text, "--input-len")
    assert "To fix" in str(info.value)


def test_a_bad_histogram_line_is_named_by_number(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text("100 1\nabc\n")
    with pytest.raises(WorkloadError, match=r"h\.txt:2: 'abc'"):
        Lengths.parse(f"hist:{path}", "--output-len")


@pytest.mark.parametrize("kind", ["poisson", "gamma:0.5", "gamma:2", "constant"])
def test_arrivals_keep_the_mean_rate(kind):
    gaps = Arrivals.parse(kind).gaps(8.0, 6000, random.Random(3))
    assert statistics.mean(gaps) == pytest.approx(1 / 8, rel=0.05)


def test_gamma_burstiness_below_one_is_burstier_than_poisson():
    def cv(kind: str) -> float:
        gaps = Arrivals.parse(kind).gaps(4.0, 6000, random.Random(4))
        return statistics.stdev(gaps) / statistics.mean(gaps)

    assert cv("constant") == 0
    assert cv("poisson") == pytest.approx(1.0, rel=0.1)
    assert cv("gamma:0.25") == pytest.approx(2.0, rel=0.15)
    with pytest.raises(WorkloadError, match="gamma:B"):
        Arrivals.parse("gamma:-1")


def test_the_same_seed_gives_the_same_lengths_at_every_rate_and_scaled_gaps():
    spec = WorkloadSpec(Lengths.parse("uniform:10,1000"), Lengths.parse("normal:64,8"), count=50)
    slow, fast = spec.requests(1.0), spec.requests(4.0)
    assert [(r.prompt_len, r.output_len) for r in slow] == [
        (r.prompt_len, r.output_len) for r in fast
    ]
    assert [r.arrival / 4 for r in slow] == pytest.approx([r.arrival for r in fast])
    assert spec.requests(1.0) == slow
    other = WorkloadSpec(spec.input, spec.output, count=50, seed=1).requests(1.0)
    assert [r.prompt_len for r in other] != [r.prompt_len for r in slow]


def test_a_trace_replays_its_shape_scaled_to_the_rate(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 5000, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]},
        {"timestamp": 6000, "input_length": 300, "output_length": 10, "hash_ids": [1]},
        {"timestamp": 9000, "input_length": 100, "output_length": 5},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = WorkloadSpec(trace=tuple(read_trace(path)), count=10)
    assert spec.native_rate == pytest.approx(0.5)  # 2 gaps over 4 s
    native = spec.requests(None)
    assert [r.arrival for r in native] == pytest.approx([0.0, 1.0, 4.0])
    assert native[0].hash_ids == (1, 2) and native[2].hash_ids == ()
    assert [r.arrival for r in spec.requests(1.0)] == pytest.approx([0.0, 0.5, 2.0])


def test_a_bad_trace_line_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(WorkloadError, match=r"t\.jsonl:2: not a trace record"):
        read_trace(path)
