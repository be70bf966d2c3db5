"""DP ranks in the virtual-time cluster: an instance with `dp` runs one scheduler per rank, as
the sim worker does, and DP attention shares the instance's GPUs between them."""

from __future__ import annotations

from kit.perf.clock import VirtualClock
from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import gpu_spec
from kit.perf.models import resolve_model
from kit.perf.scheduler import Mode
from kit.perf.workload import poisson_workload


def moe(**launch: object) -> InstanceConfig:
    return InstanceConfig(resolve_model("Qwen/Qwen3-30B-A3B"), gpu_spec("H100-SXM"), **launch)


def test_dp_attention_ranks_share_the_gpus_and_split_the_request_slots():
    single = moe(tp=4)
    shared = moe(tp=4, dp=4, dp_attention=True, ep=4)
    (one,) = single.build(Mode.DECODE, VirtualClock())
    ranks = shared.build(Mode.DECODE, VirtualClock())
    assert (single.gpus, shared.gpus) == (4, 4)
    assert len(ranks) == 4
    assert shared.attn_tp == 1
    assert ranks[0].timing.par.attn_tp == 1
    assert ranks[0].max_running == shared.memory().max_running_requests // 4
    assert one.max_running == single.memory().max_running_requests


def test_dp_replicas_without_dp_attention_each_hold_tp_gpus():
    replicas = moe(tp=2, dp=2)
    assert replicas.gpus == 4
    assert len(replicas.build(Mode.NULL, VirtualClock())) == 2


def test_a_pd_cluster_of_dp_attention_instances_serves_every_request():
    cluster = Cluster(
        prefill=Instances(moe(tp=2, dp=2, dp_attention=True, ep=2)),
        decode=Instances(moe(tp=2, dp=2, dp_attention=True, ep=2)),
    )
    outcomes = cluster.run(poisson_workload(20.0, 40, 512, 32))
    assert all(o.finish is not None and o.tokens == 32 for o in outcomes)
    assert cluster.gpus == 4


def test_decode_extra_slots_follow_sglang_defaults_and_survive_a_role_switch():
    def slots(mode: Mode, launched: Mode | None = None, **launch: object) -> int:
        (rank, *_) = moe(tp=2, **launch).build(mode, VirtualClock(), launched=launched)
        return rank.extra_slots

    # A decode launch with a small --max-running-requests reserves twice the batch.
    assert slots(Mode.DECODE, max_running_requests=8) == 16
    assert slots(Mode.DECODE, max_running_requests=64) == 0  # large batches get none
    assert slots(Mode.DECODE) == 0  # no --max-running-requests: none
    assert slots(Mode.DECODE, max_running_requests=8, decode_extra_slots=3) == 3
    # A prefill launch computes no default, and switching it to decode keeps that.
    assert slots(Mode.DECODE, launched=Mode.PREFILL, max_running_requests=8) == 0
    # Split between DP-attention ranks: 8 // 2 per rank.
    (rank, _) = moe(tp=2, dp=2, dp_attention=True, ep=2, max_running_requests=8).build(
        Mode.DECODE, VirtualClock()
    )
    assert rank.extra_slots == 8
