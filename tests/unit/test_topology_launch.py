"""The one count of an instance's GPUs and attention TP, used by the Plan, perf, sizing, the
sim and SGLang's checks alike."""

from __future__ import annotations

import pytest

from kit.topology.launch import Parallelism


@pytest.mark.parametrize(
    ("parallelism", "gpus", "attn_tp"),
    [
        (Parallelism(), 1, 1),
        (Parallelism(tp=4, pp=2), 8, 4),
        (Parallelism(tp=2, dp=2), 4, 2),
        (Parallelism(tp=8, dp=8, dp_attention=True, ep=8), 8, 1),
        (Parallelism(tp=8, dp=4, dp_attention=True, pp=2), 16, 2),
    ],
)
def test_gpus_count_pipeline_stages_and_dp_attention_shares_the_tp_gpus(parallelism, gpus, attn_tp):
    assert (parallelism.gpus, parallelism.attn_tp) == (gpus, attn_tp)
