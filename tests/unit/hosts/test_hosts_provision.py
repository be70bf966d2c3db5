"""What `pdkit provision` asks of each host, derived from the Plan: which roles apply, the RDMA
devices and GID index the workers use, the GPUs counted on, where the model and the Python
packages come from; and the option parsing a user meets."""

from __future__ import annotations

import dataclasses
import tarfile
from pathlib import Path

import pytest
import yaml

from kit.errors import DeployError
from kit.hosts.context import load_context
from kit.hosts.provision import (
    _pdkit_wheel,
    check_deep_gemm,
    check_skip,
    describe_facts,
    parse_extra_vars,
    provision_inventory,
    wheel_version,
)
from tests.conftest import REPO, base_topology

WHEEL = Path("/ctl/dist/sglang_pdkit-0.1.0-py3-none-any.whl")


def host_vars(path: Path, wheelhouse: Path | None = None) -> dict[str, dict]:
    ctx = load_context(path, control_python="/ctl/venv/bin/python")
    inventory = provision_inventory(
        ctx, pdkit_wheel_path=WHEEL, wheelhouse_archive=wheelhouse, extra_vars={}
    )
    return inventory["all"]["children"]["pdkit_hosts"]["hosts"]


@pytest.fixture
def gpu_topology(write_topology):
    data = base_topology()
    data["hosts"].append({"name": "lb", "address": "10.0.0.3", "gpus": 0})
    data["router"]["host"] = "lb"
    data["transfer"]["gid_index"] = 3
    return write_topology(data)


def test_gpu_hosts_get_the_nics_gid_index_and_gpu_count_their_workers_use(gpu_topology):
    hosts = host_vars(gpu_topology)
    a = hosts["a"]
    assert a["pdkit_provision_gpu_roles"] is True
    assert a["pdkit_nvidia_expected_gpus"] == 8
    # Prefill on a: 2 instances x tp 2 on GPUs 0-3, one NIC per GPU.
    assert a["pdkit_rdma_expected_devices"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert a["pdkit_rdma_required"] is True
    assert a["pdkit_rdma_require_gpudirect"] is True
    assert a["pdkit_rdma_gid_index"] == "3"
    assert a["pdkit_model_source"] == "hub"
    assert a["pdkit_model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert a["pdkit_python_sglang_version"] == "0.5.23"
    assert a["pdkit_python_venv"] == "/opt/pdkit/venv"  # the venv `pdkit up` runs
    assert a["pdkit_model_hf_home"] == "/var/lib/pdkit/huggingface"  # the workers' HF_HOME
    assert a["pdkit_python_source"] == "index"
    assert a["pdkit_python_pdkit_wheel"] == str(WHEEL)


def test_the_package_set_comes_from_the_pinned_versions_dialect_through_the_plan(
    write_topology, monkeypatch
):
    data = base_topology()
    data["sglang_version"] = "0.5.22"
    a = host_vars(write_topology(data))["a"]
    assert a["pdkit_python_sglang_version"] == "0.5.22"
    assert a["pdkit_python_mooncake_version"] == "0.3.13.post1"
    assert a["pdkit_python_mooncake_fallback_package"] == "mooncake-transfer-engine-cuda13"
    assert (a["pdkit_nvidia_min_driver_branch"], a["pdkit_nvidia_cuda"]) == (580, "13")
    # A dialect with another stack changes what provisioning installs, through the Plan only.
    from kit.sglang.dialects import DIALECTS  # noqa: PLC0415

    old = DIALECTS["0.5.22"]
    other = old.packages.model_copy(
        update={
            "cuda": "12",
            "mooncake_package": "mooncake-transfer-engine",
            "mooncake_version": "0.3.9",
            "min_driver_branch": 550,
        }
    )
    monkeypatch.setitem(DIALECTS, "0.5.22", dataclasses.replace(old, packages=other))
    a = host_vars(write_topology(data))["a"]
    assert a["pdkit_python_mooncake_fallback_package"] == "mooncake-transfer-engine"
    assert a["pdkit_python_mooncake_version"] == "0.3.9"
    assert (a["pdkit_nvidia_min_driver_branch"], a["pdkit_nvidia_cuda"]) == (550, "12")


def test_a_router_only_host_gets_no_gpu_rdma_or_model_work(gpu_topology):
    lb = host_vars(gpu_topology)["lb"]
    assert lb["pdkit_provision_gpu_roles"] is False
    assert lb["pdkit_rdma_required"] is False
    assert lb["pdkit_rdma_require_gpudirect"] is False
    assert lb["pdkit_model_source"] == "none"


def test_sim_needs_no_gpu_rdma_tools_or_weights_and_local_hosts_no_venv():
    localhost = host_vars(REPO / "topologies" / "local.yaml")["localhost"]
    assert localhost["pdkit_provision_gpu_roles"] is False
    assert localhost["pdkit_base_rdma_tools"] is False
    assert localhost["pdkit_base_compilers"] is False  # no Triton in the sim worker
    assert localhost["pdkit_model_source"] == "none"
    assert "pdkit_python_venv" not in localhost  # the control machine's own venv runs it


def test_an_absolute_model_path_is_checked_not_downloaded(write_topology):
    data = base_topology()
    data["model"]["path"] = "/models/llama"
    assert host_vars(write_topology(data))["a"]["pdkit_model_source"] == "path"


def test_a_wheelhouse_turns_the_index_off_and_extra_vars_win(gpu_topology):
    ctx = load_context(gpu_topology, control_python="/ctl/venv/bin/python")
    inventory = provision_inventory(
        ctx,
        pdkit_wheel_path=WHEEL,
        wheelhouse_archive=Path("/ctl/wheelhouse.tar"),
        extra_vars={"pdkit_model_source": "none"},
    )
    a = inventory["all"]["children"]["pdkit_hosts"]["hosts"]["a"]
    assert a["pdkit_python_source"] == "wheelhouse"
    assert a["pdkit_python_wheelhouse"] == "/ctl/wheelhouse.tar"
    assert a["pdkit_model_source"] == "none"
    assert inventory["all"]["vars"]["pdkit_python_pdkit_version"] == "0.1.0"
    # Still the inventory `pdkit up` uses: same connection and layout.
    assert a["ansible_host"] == "10.0.0.1"
    assert a["pdkit_log_dir"] == "/var/log/pdkit/t"


def test_extra_vars_are_read_as_yaml_values():
    assert parse_extra_vars(["a=false", "b=3", "c=[x, y]", "d=text", "e="]) == {
        "a": False,
        "b": 3,
        "c": ["x", "y"],
        "d": "text",
        "e": "",
    }
    with pytest.raises(DeployError, match="expected NAME=VALUE"):
        parse_extra_vars(["no-equals"])


def test_unknown_roles_to_skip_are_named():
    assert check_skip(["nvidia", "model"]) == ("nvidia", "model")
    with pytest.raises(DeployError, match=r"--skip nvida: no such role\. Roles: base, nvidia"):
        check_skip(["nvida"])


def test_the_wheelhouse_s_own_pdkit_wheel_is_the_one_pushed(tmp_path):
    folder = tmp_path / "wh"
    folder.mkdir()
    (folder / "sglang_pdkit-9.9-py3-none-any.whl").write_bytes(b"pdkit")
    (folder / "rich-1.0-py3-none-any.whl").write_bytes(b"rich")
    assert _pdkit_wheel(folder, tmp_path / "work") == folder / "sglang_pdkit-9.9-py3-none-any.whl"
    archive = tmp_path / "wh.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(folder / "sglang_pdkit-9.9-py3-none-any.whl", "sglang_pdkit-9.9-py3-none-any.whl")
    extracted = _pdkit_wheel(archive, tmp_path / "work")
    assert extracted.read_bytes() == b"pdkit"
    assert wheel_version(extracted) == "9.9"


def test_facts_read_as_one_line_per_kind():
    found = {
        "pdkit_nvidia_facts": {
            "gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 8,
            "driver_version": "570.86.15",
            "cuda_version": "12.8",
            "nvswitches": 4,
        },
        "pdkit_rdma_facts": {
            "devices": [
                {"name": "mlx5_0", "ports": [{"state": "ACTIVE", "link_layer": "Ethernet"}]},
                {"name": "mlx5_1", "ports": [{"state": "DOWN", "link_layer": "InfiniBand"}]},
            ]
        },
    }
    assert describe_facts(found) == [
        "8 GPU(s) NVIDIA H100 80GB HBM3; driver 570.86.15, CUDA 12.8, 4 NVSwitch(es)",
        "RDMA: mlx5_0 ACTIVE Ethernet, mlx5_1 DOWN InfiniBand",
    ]
    assert describe_facts({"pdkit_rdma_facts": {"devices": []}}) == ["RDMA: no device"]


def test_every_role_default_is_documented_and_prefixed():
    """Each setting follows a comment, directly or in a group of settings the comment heads."""
    roles = sorted((REPO / "playbooks" / "roles").glob("*/defaults/main.yml"))
    assert len(roles) == 10
    for defaults in roles:
        role = defaults.parent.parent.name
        lines = defaults.read_text().splitlines()
        names = yaml.safe_load(defaults.read_text())
        for name in names:
            assert name.startswith(f"{role}_"), (defaults, name)
            index = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
            while lines[index - 1].startswith(f"{role}_"):
                index -= 1
            assert lines[index - 1].startswith("#"), (defaults, name)


def test_the_python_role_pins_the_mooncake_version_pdkit_s_sim_extra_pins():
    import tomllib  # noqa: PLC0415

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    sim = pyproject["project"]["optional-dependencies"]["sim"]
    defaults = yaml.safe_load((REPO / "playbooks/roles/pdkit_python/defaults/main.yml").read_text())
    assert f"mooncake-transfer-engine-non-cuda=={defaults['pdkit_python_mooncake_version']}" in sim


def test_nixl_hosts_get_the_same_rdma_checks(write_topology):
    data = base_topology()
    data["transfer"]["backend"] = "nixl"
    a = host_vars(write_topology(data))["a"]
    assert a["pdkit_rdma_required"] is True
    assert a["pdkit_rdma_expected_devices"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


def test_only_hosts_of_deepep_workers_must_have_the_ibgda_driver_options(write_topology):
    data = base_topology()
    data["decode"]["args"] = {"moe-a2a-backend": "deepep"}
    hosts = host_vars(write_topology(data))
    assert hosts["b"]["pdkit_nvidia_require_ibgda"] is True
    assert hosts["a"]["pdkit_nvidia_require_ibgda"] is False


def test_sglang_hosts_get_the_compiler_triton_needs_at_first_launch(gpu_topology):
    for host in host_vars(gpu_topology).values():
        assert host["pdkit_base_compilers"] is True
    defaults = yaml.safe_load((REPO / "playbooks/roles/pdkit_base/defaults/main.yml").read_text())
    assert "gcc" in defaults["pdkit_base_compiler_packages"]
    python = yaml.safe_load((REPO / "playbooks/roles/pdkit_python/defaults/main.yml").read_text())
    assert "python3.11-dev" in python["pdkit_python_interpreter_packages"]  # Python.h


def test_router_kind_smg_installs_smg_on_the_router_host_only(write_topology):
    data = base_topology()
    data["router"] = {"host": "b", "kind": "smg"}
    hosts = host_vars(write_topology(data))
    assert hosts["b"]["pdkit_python_router_packages"] == ["smg==1.13.0"]
    assert hosts["a"]["pdkit_python_router_packages"] == []
    data["router"]["kind"] = "pdkit"  # pdkit's router is pdkit itself
    assert host_vars(write_topology(data))["b"]["pdkit_python_router_packages"] == []


def test_a_process_s_executable_is_checked_on_its_host_before_any_start():
    tasks = yaml.safe_load((REPO / "playbooks/roles/pdkit_process/tasks/inputs.yml").read_text())
    names = [t["name"] for t in tasks]
    assert "Ensure every process's executable is installed on its host" in names
    main = yaml.safe_load((REPO / "playbooks/roles/pdkit_process/tasks/main.yml").read_text())
    assert main[0]["ansible.builtin.include_tasks"] == "inputs.yml"  # before any file or start


def test_nixl_is_installed_on_worker_hosts_of_a_nixl_topology(write_topology):
    data = base_topology()
    data["hosts"].append({"name": "lb", "address": "10.0.0.3", "gpus": 0})
    data["router"]["host"] = "lb"
    data["transfer"]["backend"] = "nixl"
    hosts = host_vars(write_topology(data))
    assert hosts["a"]["pdkit_python_nixl"] is True and hosts["b"]["pdkit_python_nixl"] is True
    assert hosts["lb"]["pdkit_python_nixl"] is False
    data["transfer"]["backend"] = "mooncake"
    assert host_vars(write_topology(data))["a"]["pdkit_python_nixl"] is False


def test_compile_deep_gemm_lists_the_single_node_fp8_workers_and_refuses_other_models(
    write_topology,
):
    data = base_topology()
    data["model"] = {"path": "deepseek-ai/DeepSeek-V3", "trust_remote_code": True}
    data["prefill"] = {"count": 1, "tp": 8, "hosts": ["a"]}
    data["decode"] = {"count": 1, "tp": 8, "hosts": ["b"]}
    ctx = load_context(write_topology(data), control_python="/ctl/venv/bin/python")
    inventory = provision_inventory(
        ctx,
        pdkit_wheel_path=WHEEL,
        wheelhouse_archive=None,
        extra_vars={},
        compile_deep_gemm=True,
    )
    hosts = inventory["all"]["children"]["pdkit_hosts"]["hosts"]
    assert hosts["a"]["pdkit_python_compile_deep_gemm"] == ["prefill-0"]
    assert hosts["b"]["pdkit_python_compile_deep_gemm"] == ["decode-0"]
    # The task runs each listed process's own record: its flags and environment.
    [record] = [p for p in hosts["a"]["pdkit_processes"] if p["name"] == "prefill-0"]
    assert "--disaggregation-mode" in record["args"] and record["env"]["HF_HOME"]
    check_deep_gemm(ctx.plan, ())
    with pytest.raises(DeployError, match="do not --skip python"):
        check_deep_gemm(ctx.plan, ("python",))

    llama = load_context(write_topology(base_topology()), control_python="/ctl/venv/bin/python")
    with pytest.raises(DeployError, match="is not an FP8 model of engine sglang"):
        check_deep_gemm(llama.plan, ())
    assert host_vars(write_topology(base_topology()))["a"]["pdkit_python_compile_deep_gemm"] == []
