"""Rendered commands: golden files, the SGLang docs' flags, determinism, secrets."""

from __future__ import annotations

import json
import os

import pytest

from kit.lb.config import parse_args
from kit.plan.resolve import resolve
from kit.plan.shell import plan_to_shell
from tests.conftest import REPO, TOPOLOGIES, base_topology

GOLDEN = REPO / "tests" / "golden"


def test_every_example_topology_is_covered():
    names = {p.stem for p in TOPOLOGIES}
    assert {"local", "llama-8b-1p1d", "deepseek-v3-2p2d", "qwen3-2p1d-nicmap"} <= names


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_rendered_shell_matches_golden(topology):
    # Paths taken from the topology's folder (local-sglang's model and interpreter) are
    # absolute: the golden file holds them from the checkout's root, wherever that is.
    text = plan_to_shell(resolve(topology)).replace(str(REPO), "<repo>")
    golden = GOLDEN / f"{topology.stem}.sh"
    if os.environ.get("PDKIT_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), "run PDKIT_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py"
    assert text == golden.read_text()


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_rendering_is_byte_identical(topology):
    assert resolve(topology).model_dump_json() == resolve(topology).model_dump_json()


def args_of(plan, name):
    return " ".join(next(w for w in plan.workers if w.name == name).command.args)


def test_docs_one_host_1p1d_flags():
    plan = resolve(REPO / "topologies" / "llama-8b-1p1d.yaml")
    prefill, decode = args_of(plan, "prefill-0"), args_of(plan, "decode-0")
    assert "--port 30000 --disaggregation-mode prefill" in prefill
    assert "--disaggregation-ib-device mlx5_roce0" in prefill
    assert "--port 30001 --disaggregation-mode decode" in decode
    assert "--base-gpu-id 7" in decode  # decodes fill a shared host from its top (place.py)
    router = plan.router.command.args
    assert " ".join(router).startswith(
        "--prefill http://10.0.0.1:30000 8998 --decode "
        "http://10.0.0.1:30001 --host 0.0.0.0 --port 8000"
    )


def test_large_scale_ep_recipe_renders_every_flag_and_a_nic_per_gpu():
    plan = resolve(REPO / "topologies" / "deepseek-r1-ep.yaml")
    prefill = [w for w in plan.workers if w.role == "prefill"]
    decode = [w for w in plan.workers if w.role == "decode"]
    assert [(len(prefill), prefill[0].launch.parallelism.ep)] == [(4, 32)]
    assert [(len(decode), decode[0].launch.parallelism.ep)] == [(9, 72)]
    both = (
        "--moe-a2a-backend deepep",
        "--moe-dense-tp-size 1",
        "--enable-dp-lm-head",
        "--disable-radix-cache",
        "--enable-two-batch-overlap",
        "--ep-num-redundant-experts 32",
        "--page-size 1",
    )
    own = {
        "prefill": (
            "--tp-size 32 --attn-dp-size 32",
            "--deepep-mode normal",
            "--chunked-prefill-size 524288",
            "--max-total-tokens 131072",
            "--init-expert-location /data/eplb/prefill_in4096.json",
            "--ep-dispatch-algorithm dynamic",
            "--eplb-algorithm deepseek",
            "--deepep-config /data/deepep/prefill_config.json",
        ),
        "decode": (
            "--tp-size 72 --attn-dp-size 72",
            "--deepep-mode low_latency",
            "--mem-fraction-static 0.835",
            "--max-running-requests 18432",
            "--num-reserved-decode-tokens 102",
        ),
    }
    nic_map = json.dumps({str(g): f"mlx5_{g}" for g in range(8)}, separators=(",", ":"))
    for w in plan.workers:
        args = " ".join(w.command.args)
        for flag in (*both, *own[w.role], f"--nnodes {w.nnodes} --node-rank {w.node_rank}"):
            assert flag in args, (w.name, flag)
        # 0.5.23 deprecates --enable-dp-attention; --dp-size now counts replicas.
        assert "--enable-dp-attention" not in args and "--dp-size" not in args
        assert w.ib_device == nic_map
        assert w.env["NVSHMEM_HCA_LIST"] == ",".join(f"mlx5_{g}:1" for g in range(8))
        assert w.env["NCCL_SOCKET_IFNAME"] == w.env["GLOO_SOCKET_IFNAME"] == "bond0"
        assert w.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "100000"


def test_docs_deepseek_v3_flags():
    plan = resolve(REPO / "topologies" / "deepseek-v3-2p2d.yaml")
    assert [w.name for w in plan.workers] == [
        "prefill-0-node0",
        "prefill-0-node1",
        "decode-0-node0",
        "decode-0-node1",
    ]
    for w in plan.workers:
        args = " ".join(w.command.args)
        for flag in (
            "--trust-remote-code",
            "--tp-size 16",
            "--attn-dp-size 8",
            "--moe-a2a-backend deepep",
            "--mem-fraction-static 0.8",
            "--nnodes 2",
            f"--node-rank {w.node_rank}",
            f"--host {w.address}",
        ):
            assert flag in args, (w.name, flag)
    assert "--dist-init-addr 10.0.1.10:5000" in args_of(plan, "prefill-0-node1")
    assert "--dist-init-addr 10.0.1.20:5000" in args_of(plan, "decode-0-node0")
    assert "--max-running-requests 128" in args_of(plan, "decode-0-node1")
    assert "--port 30000" in args_of(plan, "prefill-0-node0")
    assert "--port 30001" in args_of(plan, "decode-0-node0")
    # Only rank 0 of each instance is a router target.
    assert plan.router.command.args.count("--prefill") == 1


def test_dp_replicas_render_dp_size_and_dp_attention_renders_attn_dp_size(write_topology):
    data = base_topology()
    data["prefill"].update(tp=2, dp=2, dp_attention=True, count=1)
    data["decode"].update(tp=1, dp=2)
    plan = resolve(write_topology(data))
    prefill = args_of(plan, "prefill-0")
    decode = args_of(plan, "decode-0")
    assert "--attn-dp-size 2" in prefill and "--dp-size" not in prefill
    assert "--dp-size 2" in decode and "--attn-dp-size" not in decode
    assert "--enable-dp-attention" not in prefill + decode
    assert plan.workers[0].launch.parallelism.attention_dp


def test_per_gpu_nic_map_uses_the_instance_gpus():
    plan = resolve(REPO / "topologies" / "qwen3-2p1d-nicmap.yaml")
    p1 = next(w for w in plan.workers if w.name == "prefill-1")
    assert p1.gpus == (4, 5, 6, 7)
    assert p1.ib_device == '{"4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}'
    assert p1.env["MC_GID_INDEX"] == "3"
    assert "--base-gpu-id 4" in " ".join(p1.command.args)


def test_router_secret_is_referenced_never_inlined():
    plan = resolve(REPO / "topologies" / "qwen3-2p1d-nicmap.yaml")
    shell = plan_to_shell(plan)
    assert '--cb-timeout-duration-secs 1 \\\n  --api-key "$PDKIT_ROUTER_API_KEY"\n' in shell
    assert "PDKIT_API_KEY" not in " ".join(plan.router.command.args)


def test_smg_router_gets_every_prefill_bootstrap_port():
    plan = resolve(REPO / "topologies" / "qwen3-2p1d-nicmap.yaml")
    args = " ".join(plan.router.command.args)
    assert args.startswith(
        "launch --pd-disaggregation --prefill http://10.0.2.1:30000 8998 "
        "--prefill http://10.0.2.1:30001 8999 --decode http://10.0.2.2:30100"
    )
    assert "--prometheus-port 29000" in args


def test_smg_gets_the_topologys_retry_and_circuit_breaker_settings(write_topology):
    data = base_topology()
    data["router"] = {
        "kind": "smg",
        "faults": {"retries": 2, "eject_after_failures": 4, "eject_backoff_s": 2.5},
    }
    args = " ".join(resolve(write_topology(data, "smg.yaml")).router.command.args)
    assert "--retry-max-retries 3 --retry-initial-backoff-ms 50" in args  # attempts in all
    assert "--cb-failure-threshold 4 --cb-timeout-duration-secs 3" in args
    data["router"]["faults"] = {"retries": 0}
    args = " ".join(resolve(write_topology(data, "smg0.yaml")).router.command.args)
    assert "--disable-retries" in args and "--retry-max-retries" not in args


def test_pdkit_router_gets_only_the_fault_settings_that_differ_from_its_defaults(write_topology):
    data = base_topology()
    plain = resolve(write_topology(data, "a.yaml")).router.command.args
    assert not {"--retries", "--hold-timeout", "--stall-timeout"} & set(plain)
    data["router"] = {"faults": {"hold_timeout_s": 8, "migrate": False, "retries": 1}}
    data["slo"] = {"ttft_ms": 400, "tpot_ms": 80}
    args = " ".join(resolve(write_topology(data, "b.yaml")).router.command.args)
    assert "--retries 1" in args and "--hold-timeout 8" in args and "--no-migrate" in args
    assert "--stall-timeout 4" in args  # 50 x the topology's TPOT objective
    config = parse_args([*resolve(write_topology(data, "b.yaml")).router.command.args], environ={})
    assert config.hold_timeout == 8 and config.stall_after == 4 and not config.migrate


def test_the_token_canary_is_on_by_default_and_its_interval_comes_from_the_topology(
    write_topology,
):
    data = base_topology()
    plain = resolve(write_topology(data, "a.yaml")).router.command.args
    assert "--canary-interval" not in plain  # the default, 60 s
    assert parse_args([*plain], environ={}).canary_interval == 60
    for interval, shown in ((5, "5"), (0, "0")):
        data["router"] = {"canary": {"interval_s": interval}}
        args = resolve(write_topology(data, f"c{interval}.yaml")).router.command.args
        assert f"--canary-interval {shown}" in " ".join(args)
        assert parse_args([*args], environ={}).canary_interval == interval


def test_sim_engine_renders_the_same_argv_as_sglang(write_topology):
    data = base_topology()
    sglang = resolve(write_topology(data, "a.yaml"))
    data["engine"] = "sim"
    sim = resolve(write_topology(data, "b.yaml"))
    for real, emulated in zip(sglang.workers, sim.workers, strict=True):
        assert real.command.module == "sglang.launch_server"
        assert emulated.command.module == "kit.sim"
        assert real.command.args == emulated.command.args


def test_user_args_render_sorted_with_bool_and_list_rules(write_topology):
    data = base_topology()
    data["defaults"] = {
        "args": {
            "watchdog-timeout": 600,
            "enable-metrics": False,
            "disable-radix-cache": True,
            "chunked_prefill_size": 4096,
        }
    }
    args = list(resolve(write_topology(data)).workers[0].command.args)
    tail = args[args.index("--nccl-port") + 2 :]
    assert tail == [
        "--chunked-prefill-size",
        "4096",
        "--disable-radix-cache",
        "--watchdog-timeout",
        "600",
    ]


def test_a_relative_key_file_is_taken_from_the_topology_folder(write_topology, tmp_path):
    data = base_topology()
    data["router"]["api_key_file"] = "secrets/key"
    plan = resolve(write_topology(data))
    assert plan.router.api_key_file == str(tmp_path / "secrets" / "key")


def test_router_metrics_url_follows_the_router_kind():
    local = resolve(REPO / "topologies" / "local.yaml").router
    assert local.metrics_url == "http://127.0.0.1:8000/metrics"
    smg = resolve(REPO / "topologies" / "qwen3-2p1d-nicmap.yaml").router
    assert smg.metrics_url == "http://10.0.2.1:29000/metrics"


def test_nixl_gets_ucx_devices_from_the_nic_map(write_topology):
    """One device per process: UCX_NET_DEVICES (and UCX's GID index); several: the per-GPU map
    in --disaggregation-ib-device, which SGLang 0.5.23 hands NIXL GPU by GPU."""
    data = base_topology()  # prefill tp 2 on GPUs 0-1 and 2-3 of a; decode tp 4 on b
    data["transfer"] = {"backend": "nixl", "gid_index": 3}
    data["hosts"][0]["gpu_nics"] = {0: "mlx5_0", 1: "mlx5_0", 2: "mlx5_1", 3: "mlx5_1"}
    plan = resolve(write_topology(data))
    workers = {w.name: w for w in plan.workers}
    prefill = workers["prefill-1"]
    assert prefill.env["UCX_NET_DEVICES"] == "mlx5_1:1"
    assert prefill.env["UCX_IB_GID_INDEX"] == "3" and "MC_GID_INDEX" not in prefill.env
    assert "--disaggregation-ib-device" not in prefill.command.args
    assert prefill.rdma_devices == ("mlx5_1",)
    decode = workers["decode-0"]
    assert "UCX_NET_DEVICES" not in decode.env
    assert decode.ib_device == '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3"}'
    assert decode.ib_device in decode.command.args


def test_nixl_needs_rdma_devices_like_mooncake(write_topology):
    from kit.errors import TopologyError  # noqa: PLC0415

    data = base_topology()
    data["transfer"] = {"backend": "nixl"}
    for host in data["hosts"]:
        host.pop("gpu_nics")
        host["rdma_devices"] = []
    with pytest.raises(TopologyError, match=r"transfer\.backend nixl moves KV over RDMA"):
        resolve(write_topology(data))
