"""The timing model's physics: compute-bound prefill, memory-bound decode, capacity."""

from __future__ import annotations

import pytest

from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.timing import (
    Efficiency,
    StepShape,
    TimingModel,
    default_chunked_prefill_size,
    default_mem_fraction_static,
)
from kit.topology.launch import Parallelism


def model(name="Llama-2-13b", gpu="A100-80G", tp=1):
    return TimingModel(resolve_model(name), gpu_spec(gpu), Parallelism(tp=tp))


def prefill(t, n):
    return t.step_seconds(StepShape(prefill=((n, 0),), sampled=1))


def decode(t, batch, ctx=544):
    return t.step_seconds(StepShape(decode_reqs=batch, decode_context=batch * ctx, sampled=batch))


def test_prefill_is_compute_bound_and_linear_in_tokens():
    t = model()
    assert prefill(t, 2048) / prefill(t, 512) == pytest.approx(4, rel=0.1)
    # 13B on A100: 2 x 13e9 x 512 FLOPs at 60% of 312 TFLOP/s is ~70 ms.
    assert 0.06 < prefill(t, 512) < 0.09


def test_decode_is_memory_bound_and_cheap_per_extra_request():
    t = model()
    one, many = decode(t, 1), decode(t, 32)
    assert 0.015 < one < 0.025  # 26 GB of weights at 70% of 2 TB/s
    assert many < 2 * one  # batching shares the weight reads
    assert decode(t, 64) > many  # but each request's KV adds reads


def test_faster_gpus_and_tensor_parallelism_shorten_steps():
    assert decode(model(gpu="H100-SXM"), 8) < decode(model(), 8)
    assert prefill(model(tp=2), 4096) < prefill(model(), 4096) * 0.6
    assert decode(model("Llama-3.1-70B", "H100-SXM", tp=8), 8) < 0.03


def test_moe_decode_reads_only_the_touched_experts():
    t = model("DeepSeek-V3", "H200", tp=8)
    # One token routes to 8 of 256 experts; 64 tokens touch most of them, 256 nearly all.
    assert 3 * decode(t, 1) < decode(t, 64)
    assert decode(t, 256) < 1.3 * decode(t, 64)


def test_kv_capacity_and_sglang_defaults():
    gpu = gpu_spec("A100-80G")
    assert default_chunked_prefill_size(gpu) == 8192
    fraction = default_mem_fraction_static(gpu, 8192, 1, 1)
    assert fraction == pytest.approx(0.842, abs=0.001)
    t = model()
    capacity = t.kv_capacity_tokens(fraction)
    assert 50_000 < capacity < 60_000  # (0.842 x 80 GiB - 26 GB) / 0.82 MB per token
    assert model("Llama-3.1-70B", "A100-80G").kv_capacity_tokens(fraction) == 0  # no fit
    assert model("Llama-3.1-70B", "A100-80G", tp=4).kv_capacity_tokens(fraction) > 100_000


def test_kv_transfer_time_scales_with_prompt():
    t = model()
    assert t.kv_transfer_seconds(2048) > 3 * t.kv_transfer_seconds(512)
    assert t.kv_transfer_seconds(512, rdma=False) > t.kv_transfer_seconds(512)


def test_a_gpu_measured_here_uses_its_measured_bandwidth_and_others_the_sourced_factors():
    h200, h100 = gpu_spec("H200"), gpu_spec("H100-SXM")
    assert Efficiency.for_gpu(h100) == Efficiency()
    measured = Efficiency.for_gpu(h200)
    assert measured.compute == Efficiency().compute  # the prefill measurement kept 0.6
    assert measured.memory == h200.memory_efficiency == pytest.approx(0.83)
    assert h200.measured and not h100.measured
    # Llama-3.1-8B decoding 16 requests on an H200: 15 GB of weights and 1.1 GB of KV at 83%
    # rather than 70% of 4.8 TB/s, plus the same 1.8 ms of fixed costs.
    default = decode(model("Llama-3.1-8B", "H200"), 16)
    sourced = TimingModel(
        resolve_model("Llama-3.1-8B"), h200, Parallelism(), efficiency=Efficiency()
    )
    assert default == pytest.approx(0.0059, rel=0.03)
    assert decode(sourced, 16) - default == pytest.approx(
        16.2e9 / 4.8e12 * (1 / 0.7 - 1 / 0.83), rel=0.05
    )
