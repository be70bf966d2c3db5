"""CPU hosts (`hosts[].device: cpu`): what they render, what validation refuses on them, and
the interpreter engine sglang's workers run with there (`hosts[].sglang_python`)."""

from __future__ import annotations

import pytest
import yaml

from kit.errors import TopologyError
from kit.hosts.inventory import build_inventory, deploy_hosts
from kit.plan.resolve import resolve
from kit.sglang import cpu
from tests.conftest import REPO


def local_sglang() -> dict:
    data = yaml.safe_load((REPO / "topologies" / "local-sglang.yaml").read_text())
    data["model"]["path"] = "/models/tiny-llama"
    data["hosts"][0]["sglang_python"] = "/opt/sglang/bin/python"
    return data


def flag(args: tuple[str, ...], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def problems(write_topology, data) -> dict[str, str]:
    with pytest.raises(TopologyError) as info:
        resolve(write_topology(data))
    return {p.key: f"{p.message} {p.fix}" for p in info.value.problems}


def test_a_cpu_host_renders_the_cpu_profile_and_a_nccl_port_per_server(write_topology):
    data = local_sglang()
    data["decode"]["count"] = 2
    plan = resolve(write_topology(data))
    ports = []
    for w in plan.workers:
        args = w.command.args
        assert flag(args, "--device") == "cpu" and w.gpus == () and w.launch.device == "cpu"
        assert flag(args, "--attention-backend") == "torch_native"
        assert flag(args, "--cuda-graph-backend-decode") == "disabled"
        assert flag(args, "--cuda-graph-backend-prefill") == "disabled"
        assert flag(args, "--max-total-tokens") == "4096"
        assert "--disable-cuda-graph" not in args  # deprecated in 0.5.23
        backup = flag(args, "--disaggregation-decode-retraction-backup")
        assert backup == ("cpu_tensor" if w.role == "decode" else None)
        assert flag(args, "--nccl-port") == str(w.nccl_port)
        ports.append(w.nccl_port)
        assert w.env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert w.env["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] == "0"
        assert (w.env["MOONCAKE_PROTOCOL"], w.env["MC_TCP_BIND_ADDRESS"]) == ("tcp", "127.0.0.1")
        assert w.python == "/opt/sglang/bin/python"
    assert ports == [30500, 30600, 30601]  # prefill base, decode base + instance index


def test_the_topologys_args_and_env_win_over_the_cpu_profile(write_topology):
    data = local_sglang()
    data["defaults"]["args"]["max-total-tokens"] = 8192
    data["decode"]["args"] = {"disaggregation-decode-retraction-backup": "none"}
    data["decode"]["env"] = {"MC_TCP_BIND_ADDRESS": "0.0.0.0"}
    plan = resolve(write_topology(data))
    (prefill,), (decode,) = plan.role("prefill"), plan.role("decode")
    assert flag(prefill.command.args, "--max-total-tokens") == "8192"
    assert prefill.launch.max_total_tokens == 8192 and decode.launch.max_total_tokens == 8192
    assert flag(decode.command.args, "--disaggregation-decode-retraction-backup") == "none"
    assert decode.env["MC_TCP_BIND_ADDRESS"] == "0.0.0.0"


@pytest.mark.parametrize("key", [cpu.DEVICE_FLAG, cpu.NCCL_PORT_FLAG])
def test_the_flags_pdkit_owns_on_a_cpu_host_cannot_be_set_in_args(write_topology, key):
    data = local_sglang()
    data["prefill"]["args"] = {key: "cpu" if key == "device" else 31000}
    found = problems(write_topology, data)
    assert f"--{key} is set by pdkit" in found[f"prefill.args.{key}"]


def test_validation_says_what_a_cpu_host_cannot_do(write_topology):
    data = local_sglang()
    data["hosts"][0] |= {"gpus": 2, "gpu_type": "H100-SXM", "rdma_devices": ["mlx5_0"]}
    data["hosts"][0]["gpu_nics"] = {0: "mlx5_0"}
    data["prefill"]["tp"] = 2
    data["decode"]["dp_attention"] = True
    data["transfer"] = {"backend": "mooncake", "ib_devices": ["mlx5_0"]}
    found = problems(write_topology, data)
    assert "set gpus: 0" in found["hosts[0].gpus"]
    assert "remove gpu_type" in found["hosts[0].gpu_type"]
    assert "remove rdma_devices" in found["hosts[0].rdma_devices"]
    assert "remove gpu_nics" in found["hosts[0].gpu_nics"]
    assert "needs 2 CPU hosts" in found["prefill"] and "set prefill.tp: 1" in found["prefill"]
    assert "set decode.dp_attention: false" in found["decode.dp_attention"]
    assert "over RDMA" in found["transfer.backend"] and "mooncake_tcp" in found["transfer.backend"]
    assert "remove transfer.ib_devices" in found["transfer.ib_devices"]


def cpu_hosts(data: dict, names: str) -> None:
    """Replace the topology's host by one CPU host per letter of `names`."""
    host = data["hosts"][0]
    data["hosts"] = [
        host | {"name": n, "address": f"10.0.0.{i + 1}", "network_interface": "eth0"}
        for i, n in enumerate(names)
    ]


def test_a_tp_2_instance_on_cpu_hosts_spans_two_hosts_one_rank_each_over_gloo(write_topology):
    data = local_sglang()
    cpu_hosts(data, "abcde")
    data["prefill"]["hosts"] = ["a"]
    data["decode"] |= {"count": 2, "tp": 2, "hosts": ["b", "c", "d", "e"]}
    data["decode"]["env"] = {"SGLANG_CPU_OMP_THREADS_BIND": "0-1"}
    plan = resolve(write_topology(data))
    decodes = [(w.instance_name, w.host, w.node_rank) for w in plan.workers[1:]]
    expected = [("decode-0", "b", 0), ("decode-0", "c", 1), ("decode-1", "d", 0)]
    assert decodes == [*expected, ("decode-1", "e", 1)]
    for w in plan.workers[1:]:
        args = w.command.args
        assert flag(args, "--tp-size") == "2" and flag(args, "--nnodes") == "2"
        assert flag(args, "--device") == "cpu" and w.gpus == ()
        rank0 = "10.0.0.2" if w.instance_name == "decode-0" else "10.0.0.4"
        assert flag(args, "--dist-init-addr").startswith(rank0 + ":")
        assert w.env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert w.env["SGLANG_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_tp_2_instance_on_cpu_hosts_needs_hosts_of_its_own_an_interface_and_cores(
    write_topology,
):
    data = local_sglang()
    cpu_hosts(data, "abc")
    del data["hosts"][2]["network_interface"]
    data["prefill"]["hosts"] = ["a"]
    data["decode"] |= {"tp": 2, "hosts": ["b", "c"]}
    found = problems(write_topology, data)
    assert "SGLANG_CPU_OMP_THREADS_BIND" in found["decode.env"]
    assert "GLOO_SOCKET_IFNAME" in found["hosts[2].network_interface"]
    data["decode"]["hosts"] = ["a", "b"]  # a holds the prefill
    found = problems(write_topology, data)
    assert "needs 2 CPU hosts that hold no instance yet; such hosts left: b" in found["decode"]


def test_workers_on_cpu_and_gpu_hosts_at_once_are_refused(write_topology):
    data = local_sglang()
    gpu_host = {"name": "gpu", "address": "127.0.0.2", "connection": "local", "gpus": 1}
    data["hosts"].append(gpu_host | {"service_manager": "supervisord"})
    data["decode"]["hosts"] = ["gpu"]
    found = problems(write_topology, data)
    assert "put every worker on hosts of one device" in found["hosts[0].device"]


def test_sglang_python_reaches_the_launch_script_through_the_inventory(write_topology):
    data = local_sglang()
    data["hosts"][0]["sglang_python"] = "../venv/bin/python"  # from the topology's folder
    path = write_topology(data)
    plan = resolve(path)
    expected = str(path.parent.parent / "venv" / "bin" / "python")
    assert plan.hosts[0].sglang_python == expected
    inventory = build_inventory(plan, deploy_hosts(plan, "/control/venv/bin/python"))
    host = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["localhost"]
    records = {r["name"]: r for r in host["pdkit_processes"]}
    assert host["pdkit_python"] == "/control/venv/bin/python"  # pdkit's own processes
    assert records["prefill-0"]["python"] == records["decode-0"]["python"] == expected
    assert records["router"]["python"] is None  # the router keeps pdkit's interpreter


def test_engine_sim_keeps_pdkits_interpreter_and_a_relative_model_path_is_resolved(
    write_topology,
):
    data = local_sglang()
    data["engine"] = "sim"
    data["model"]["path"] = "./models/tiny"
    path = write_topology(data)
    plan = resolve(path)
    assert all(w.python is None for w in plan.workers)
    assert plan.model.path == str(path.parent / "models" / "tiny")
    assert flag(plan.workers[0].command.args, "--model-path") == plan.model.path


def test_dp_on_cpu_hosts_is_refused_as_such_not_spread_over_hosts(write_topology):
    data = local_sglang()
    cpu_hosts(data, "ab")
    data["decode"] |= {"dp": 2, "env": {"SGLANG_CPU_OMP_THREADS_BIND": "0-1"}}
    found = problems(write_topology, data)
    assert "set decode.dp: 1" in found["decode.dp"] and "decode" not in found
