"""Each class of topology mistake is refused with a message naming the key and the fix."""

from __future__ import annotations

import copy

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from tests.conftest import base_topology


def problems_of(write_topology, data) -> list:
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    return info.value.problems


def one_problem(write_topology, data, key: str):
    found = [p for p in problems_of(write_topology, data) if p.key == key]
    assert found, f"no problem at {key}"
    return found[0]


def test_base_topology_is_valid(write_topology):
    plan = resolve(write_topology(base_topology()))
    assert [w.name for w in plan.workers] == ["prefill-0", "prefill-1", "decode-0"]


def test_unknown_key_suggests_the_closest_and_gives_its_position(write_topology):
    text = """name: t
model: {path: m}
hosts:
  - {name: a, address: 10.0.0.1, gpus: 8, rdma_devices: [mlx5_0]}
prefill:
  tp_szie: 2
"""
    problem = one_problem(write_topology, text, "prefill.tp_szie")
    assert (problem.line, problem.column) == (6, 3)
    assert "did you mean 'tp'" in str(problem)
    assert str(problem).startswith(f"{problem.file}:6:3: prefill.tp_szie: unknown key.")


def test_every_shape_error_is_reported_at_once(write_topology):
    data = base_topology()
    data["engine"] = "vllm"
    data["hosts"][0]["gpus"] = -1
    data["router"]["api_key"] = "secret"
    keys = {p.key for p in problems_of(write_topology, data)}
    assert {"engine", "hosts[0].gpus", "router.api_key"} <= keys


def test_inline_api_key_is_refused_with_the_env_var_alternative(write_topology):
    data = base_topology()
    data["router"]["api_key"] = "sk-123"
    assert "api_key_env" in str(one_problem(write_topology, data, "router.api_key"))


def test_not_enough_gpus_names_the_role_and_free_gpus(write_topology):
    data = base_topology()
    data["prefill"]["count"] = 5  # 5 x tp 2 = 10 GPUs pinned to an 8-GPU host
    problem = one_problem(write_topology, data, "prefill")
    assert "prefill instance 4 needs 2 GPUs" in problem.message
    assert "a: 0 of 8" in problem.message


def test_instance_larger_than_a_host_spans_hosts(write_topology):
    data = base_topology()
    data["hosts"].append({**copy.deepcopy(data["hosts"][1]), "name": "c", "address": "10.0.0.3"})
    data["decode"] = {"count": 1, "tp": 16, "hosts": ["b", "c"]}
    plan = resolve(write_topology(data))
    decode = [w for w in plan.workers if w.role == "decode"]
    assert [(w.host, w.node_rank, w.nnodes) for w in decode] == [("b", 0, 2), ("c", 1, 2)]
    for w in decode:
        args = list(w.command.args)
        assert args[args.index("--dist-init-addr") + 1] == "10.0.0.2:5500"
        assert args[args.index("--node-rank") + 1] == str(w.node_rank)


def test_span_needs_a_multiple_of_the_host_size(write_topology):
    data = base_topology()
    data["decode"] = {"count": 1, "tp": 12, "hosts": ["b"]}
    problem = one_problem(write_topology, data, "decode")
    assert "not a multiple of the 8 GPUs per host" in problem.message


def test_port_collision_on_one_host(write_topology):
    data = base_topology()
    data["decode"] = {"count": 1, "tp": 4, "hosts": ["a"], "port": 30001}  # prefill-1 has 30001
    problem = one_problem(write_topology, data, "decode.port")
    assert "port 30001 on a is used by both prefill-1 (HTTP) and decode-0 (HTTP)" in problem.message


def test_router_port_collides_with_bootstrap(write_topology):
    data = base_topology()
    data["router"]["port"] = 8998
    assert "prefill-0 (bootstrap)" in one_problem(write_topology, data, "router.port").message


def test_port_inside_the_mooncake_rpc_range(write_topology):
    data = base_topology()
    data["decode"]["port"] = 15500
    assert "Mooncake" in one_problem(write_topology, data, "decode.port").message


def test_roles_must_agree_on_page_size(write_topology):
    data = base_topology()
    data["prefill"]["args"] = {"page-size": 64}
    problem = one_problem(write_topology, data, "prefill.args.page-size")
    assert "prefill has --page-size 64 but decode has unset" in problem.message
    assert "defaults.args" in problem.fix


def test_roles_must_agree_on_kv_checksum_and_dtype(write_topology):
    data = base_topology()
    data["decode"]["args"] = {
        "kv-cache-dtype": "fp8_e4m3",
        "disaggregation-enable-kv-checksum": True,
    }
    keys = {p.key for p in problems_of(write_topology, data)}
    assert {"decode.args.kv-cache-dtype", "decode.args.disaggregation-enable-kv-checksum"} <= keys


def test_tp_sizes_that_do_not_divide_are_refused(write_topology):
    data = base_topology()
    data["prefill"] = {"count": 2, "tp": 3, "hosts": ["a"]}
    problem = one_problem(write_topology, data, "decode.tp")
    assert "attention-TP 3" in problem.message and "attention-TP 4" in problem.message


def test_decode_pipeline_parallelism_must_match_prefill_or_be_one(write_topology):
    data = base_topology()
    data["decode"]["pp"] = 2
    assert (
        "decode pp (2) must be 1 or equal" in one_problem(write_topology, data, "decode.pp").message
    )


def test_prefill_complete_policy_needs_attention_tp_one(write_topology):
    data = base_topology()
    data["defaults"] = {"args": {"disaggregation-decode-allocation-policy": "prefill_complete"}}
    problem = one_problem(write_topology, data, "decode.tp")
    assert "prefill_complete" in problem.message and "attention-TP 4" in problem.message


def test_heterogeneous_tp_that_divides_is_accepted(write_topology):
    data = base_topology()
    data["transfer"]["backend"] = "nixl"  # 2 -> 4 maps: each decode rank reads one prefill rank
    assert resolve(write_topology(data)).transfer_backend == "nixl"


def test_prefill_bound_to_loopback_with_a_remote_decode(write_topology):
    data = base_topology()
    data["prefill"]["bind"] = "127.0.0.1"
    problem = one_problem(write_topology, data, "prefill.bind")
    assert "binds 127.0.0.1" in problem.message and "b" in problem.message


def test_a_prefill_reached_or_advertised_at_0_0_0_0_or_loopback_is_refused(write_topology):
    data = base_topology()
    data["hosts"][0]["address"] = "0.0.0.0"
    problem = one_problem(write_topology, data, "hosts[0].address")
    assert "is reached at 0.0.0.0, which b cannot reach" in problem.message

    data = base_topology()
    data["prefill"]["env"] = {"SGLANG_HOST_IP": "127.0.0.1"}
    problem = one_problem(write_topology, data, "prefill.env")
    assert "SGLANG_HOST_IP=127.0.0.1 makes prefill-0 on a advertise an address b" in problem.message
    assert "remove SGLANG_HOST_IP" in problem.fix

    data = base_topology()
    data["defaults"] = {"env": {"SGLANG_HOST_IP": "0.0.0.0"}}
    assert "SGLANG_HOST_IP=0.0.0.0" in one_problem(write_topology, data, "defaults.env").message

    data = base_topology()
    data["prefill"]["bind"] = "0.0.0.0"  # binding every address is fine
    assert resolve(write_topology(data)).role("prefill")[0].bind == "0.0.0.0"


def test_every_gpu_needs_an_rdma_device(write_topology):
    data = base_topology()
    data["hosts"][1]["gpu_nics"] = {0: "mlx5_0", 1: "mlx5_1"}  # decode uses GPUs 0-3
    problem = one_problem(write_topology, data, "hosts[1].gpu_nics")
    assert "GPUs [2, 3]" in problem.message and "mooncake_tcp" in problem.fix


def test_rdma_not_needed_over_tcp(write_topology):
    data = base_topology()
    for host in data["hosts"]:
        host.pop("gpu_nics"), host.pop("rdma_devices")
    data["transfer"]["backend"] = "mooncake_tcp"
    plan = resolve(write_topology(data))
    assert all("--disaggregation-ib-device" not in w.command.args for w in plan.workers)


def test_router_host_must_exist(write_topology):
    data = base_topology()
    data["router"]["host"] = "c"
    assert "no host named 'c'" in one_problem(write_topology, data, "router.host").message


def test_pinned_host_must_exist(write_topology):
    data = base_topology()
    data["decode"]["hosts"] = ["bb"]
    assert "no host named 'bb'" in one_problem(write_topology, data, "decode.hosts[0]").message


@pytest.mark.parametrize(
    ("flag", "topology_key"),
    [
        ("port", "decode.port"),
        ("disaggregation-mode", "role section"),
        ("tp_size", "decode.tp"),
        ("dist-init-addr", "decode.dist_init_port"),
        ("model-path", "model.path"),
        ("attn-dp-size", "decode.dp with decode.dp_attention: true"),
        ("attention-data-parallel-size", "decode.dp with decode.dp_attention: true"),
        ("enable-dp-attention", "decode.dp_attention"),
    ],
)
def test_owned_flags_are_refused_with_the_key_to_set(write_topology, flag, topology_key):
    data = base_topology()
    data["decode"]["args"] = {flag: 1}
    problem = one_problem(write_topology, data, f"decode.args.{flag}")
    assert "is set by pdkit" in problem.message and topology_key in problem.fix


def test_unknown_flag_gets_a_suggestion(write_topology):
    data = base_topology()
    data["defaults"] = {"args": {"chunk-prefill-size": 8192}}
    problem = one_problem(write_topology, data, "defaults.args.chunk-prefill-size")
    assert "did you mean --chunked-prefill-size?" in str(problem)


def test_removed_flag_is_unknown(write_topology):
    data = base_topology()
    data["decode"]["args"] = {"cuda-graph-max-bs": 64}
    problem = one_problem(write_topology, data, "decode.args.cuda-graph-max-bs")
    assert "not a flag of SGLang 0.5.23" in problem.message


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("kv-cache-dtype", "fp9", "fp8_e4m3"),
        ("chunked-prefill-size", "big", "int"),
        ("mem-fraction-static", "most", "number"),
    ],
)
def test_flag_values_are_checked(write_topology, flag, value, words):
    data = base_topology()
    data["defaults"] = {"args": {flag: value}}
    assert words in str(one_problem(write_topology, data, f"defaults.args.{flag}"))


def test_unsupported_sglang_version(write_topology):
    data = base_topology()
    data["sglang_version"] = "0.4.0"
    assert "0.5.23" in str(one_problem(write_topology, data, "sglang_version"))


def test_yaml_syntax_error_has_a_position(write_topology):
    problems = problems_of(write_topology, "name: t\nhosts: [\n")
    assert problems[0].line is not None and "not valid YAML" in problems[0].message


def test_missing_file(tmp_path):
    with pytest.raises(TopologyError, match="cannot read the file"):
        resolve(tmp_path / "nope.yaml")
