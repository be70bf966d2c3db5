"""The sim takes launch_server's argv: honours some flags, accepts the rest."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from kit.perf.clock import RealClock
from kit.sim.args import ArgsError, parse_args
from kit.sim.engine import Engine
from kit.sim.settings import SimSettings
from kit.topology.sim_env import SettingsError

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def rendered_commands() -> list[list[str]]:
    """Every launch argv in the golden rendered plans (sim and sglang engines alike)."""
    out = []
    for path in sorted(GOLDEN.glob("*.sh")):
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            for module in ("kit.sim", "sglang.launch_server"):
                if module in words:
                    out.append(words[words.index(module) + 1 :])
    return out


@pytest.mark.parametrize("argv", rendered_commands(), ids=lambda a: " ".join(a[:4]))
def test_every_rendered_worker_command_parses(argv):
    args = parse_args(argv)
    assert args.model_path
    assert args.port > 0


def test_honoured_flags_and_defaults():
    args = parse_args(
        [
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--served-model-name",
            "llama",
            "--host",
            "0.0.0.0",
            "--port",
            "30001",
            "--disaggregation-mode",
            "decode",
            "--tp",
            "2",
            "--dp-size",
            "2",
            "--page-size",
            "16",
            "--max-running-requests",
            "128",
            "--chunked-prefill-size",
            "4096",
            "--mem-fraction-static",
            "0.8",
            "--enable-metrics",
            "--api-key",
            "k",
            "--trust-remote-code",
            "--cuda-graph-max-bs-decode",
            "64",
        ]
    )
    assert (args.served_model_name, args.host, args.port) == ("llama", "0.0.0.0", 30001)
    assert (args.tp_size, args.dp_size, args.page_size) == (2, 2, 16)
    assert args.disaggregation_bootstrap_port == 8998
    assert args.disaggregation_transfer_backend == "mooncake"
    assert args.ignored == ("--trust-remote-code", "--cuda-graph-max-bs-decode", "64")
    assert args.as_dict()["api_key"] == "<redacted>"


def test_attn_dp_size_is_dp_attention():
    args = parse_args(["--model-path", "m", "--tp-size", "16", "--attn-dp-size", "8"])
    assert (args.dp_size, args.enable_dp_attention) == (8, True)


def test_served_name_defaults_to_the_model_path():
    assert parse_args(["--model", "Qwen/Qwen3-8B"]).served_model_name == "Qwen/Qwen3-8B"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--port", "http"], "--port"),
        (["--port", "70000"], "port"),
        (["--tp-size", "0"], "positive"),
        (["--disaggregation-mode", "both"], "invalid choice"),
        (["--mem-fraction-static", "1.5"], "(0, 1]"),
        (["--chunked-prefill-size", "0"], "-1"),
        (["--host", "bad host!"], "host"),
        (["--nnodes", "2"], "--dist-init-addr"),
        (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:5000"], "node-rank"),
        (["--dist-init-addr", "nohost"], "HOST:PORT"),
        (
            ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"],
            "Mooncake",
        ),
        (
            ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "fake"],
            "decode only",
        ),
    ],
)
def test_malformed_honoured_flags_are_errors(argv, message):
    with pytest.raises(ArgsError, match=None) as err:
        parse_args(["--model-path", "m", *argv])
    assert message in str(err.value)


def test_model_path_is_required():
    with pytest.raises(ArgsError, match="--model-path"):
        parse_args(["--port", "1"])


def test_settings_defaults_and_sglang_timeouts():
    s = SimSettings.from_env({})
    assert (s.gpu, s.speed, s.kv_scale, s.bootstrap_timeout_s, s.heartbeat_max_failure) == (
        "H100-SXM",
        1.0,
        1024.0,
        300.0,
        2,
    )
    s = SimSettings.from_env(
        {
            "PDKIT_SIM_GPU": "A100-80G",
            "PDKIT_SIM_SPEED": "10",
            "PDKIT_SIM_SEED": "7",
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3",
            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
            "SGLANG_HOST_IP": "10.0.0.5",
        }
    )
    assert (s.gpu, s.speed, s.seed, s.waiting_timeout_s) == ("A100-80G", 10.0, 7, 3.0)
    assert s.heartbeat_interval_s == 2.0  # SGLang's floor
    assert s.host_ip == "10.0.0.5"
    assert s.fault is None
    assert SimSettings.from_env({"PDKIT_SIM_FAULT": "Refuse"}).fault == "refuse"


@pytest.mark.parametrize(
    "env",
    [
        {"PDKIT_SIM_SPEED": "fast"},
        {"PDKIT_SIM_SPEED": "0"},
        {"PDKIT_SIM_KV_SCALE": "0.5"},
        {"PDKIT_SIM_SEED": "x"},
        {"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "0"},
        {"PDKIT_SIM_LOG_LEVEL": "loud"},
        {"PDKIT_SIM_FAULT": "explode"},
    ],
)
def test_bad_settings_name_the_variable(env):
    with pytest.raises(SettingsError, match=next(iter(env))):
        SimSettings.from_env(env)


def on_gpus(argv: list[str]) -> bool:
    """Whether a rendered worker runs on a GPU host (a CPU host's gets --device cpu)."""
    return "--device" not in argv or argv[argv.index("--device") + 1] != "cpu"


@pytest.mark.parametrize(
    "argv", [a for a in rendered_commands() if on_gpus(a)], ids=lambda a: " ".join(a[:4])
)
def test_every_rendered_worker_fits_its_emulated_gpus(argv):
    """Each example GPU topology's workers start in the sim: known model, KV room left (a CPU
    topology's tiny model and small KV pool are for the real engine)."""
    args = parse_args(argv)

    async def build():
        return Engine(args, SimSettings.from_env({}), RealClock(asyncio.get_running_loop()))

    engine = asyncio.run(build())
    assert engine.model.matched
    assert engine.capacity_tokens > 10_000


@pytest.mark.parametrize(
    "topology", sorted((GOLDEN.parents[1] / "topologies").glob("*.yaml")), ids=lambda p: p.stem
)
def test_the_sim_models_the_instance_the_plan_records(topology):
    """Each worker's launch record in the Plan (from the topology) and the one the sim builds
    from the argv and env pdkit renders for it (at its own edge) give one modelled instance."""
    from kit.perf.cluster import InstanceConfig  # noqa: PLC0415
    from kit.plan.resolve import resolve  # noqa: PLC0415

    for worker in resolve(topology).workers:
        settings = SimSettings.from_env(worker.env)
        # For engine sglang no PDKIT_SIM_GPU is rendered: the sim would run on the host's type.
        gpu = worker.env.get("PDKIT_SIM_GPU", worker.launch.gpu_type)
        own = parse_args(list(worker.command.args)).launch(gpu, settings.speed)
        assert own.parallelism == worker.parallelism
        assert InstanceConfig.from_launch(own) == InstanceConfig.from_launch(worker.launch)
