"""The CLI as a user runs it: exit codes, every problem listed, help with examples."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, fields

import pytest
from typer.main import get_command

from kit.bench.options import BenchArgs
from kit.cli import app
from kit.cli.bench import CLI_ONLY
from kit.cli.options import args_from
from kit.sizing.command import SizeArgs
from tests.conftest import REPO, TOPOLOGIES, base_topology, run_pdkit

pdkit = run_pdkit


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_validate_accepts_every_example(topology):
    result = pdkit("validate", str(topology))
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_validate_lists_every_problem_and_exits_1(write_topology):
    data = base_topology()
    data["prefill"]["tp_szie"] = 2
    data["decode"]["args"] = {"page-size": 32, "chunk-prefill-size": 1}
    data["router"]["port"] = 8998
    result = pdkit("validate", str(write_topology(data)))
    assert result.returncode == 1
    assert result.stderr.startswith("1 problem in the topology:")  # shape errors come first
    data["prefill"].pop("tp_szie")
    result = pdkit("validate", str(write_topology(data)))
    assert result.returncode == 1
    assert "3 problems in the topology:" in result.stderr
    for key in ("decode.args.page-size", "decode.args.chunk-prefill-size", "router.port"):
        assert key in result.stderr
    lines = [int(line.split(":")[1]) for line in result.stderr.splitlines()[1:]]
    assert lines == sorted(lines)  # in file order
    assert "Traceback" not in result.stderr


def test_render_json_is_the_plan():
    result = pdkit("render", str(REPO / "topologies" / "local.yaml"), "--json")
    plan = json.loads(result.stdout)
    assert [w["name"] for w in plan["workers"]] == ["prefill-0", "prefill-1", "decode-0"]
    assert plan["workers"][0]["command"]["module"] == "kit.sim"
    assert (plan["router"]["kind"], plan["router"]["port"]) == ("pdkit", 8000)


def test_render_prints_paste_able_lines_per_host():
    result = pdkit("render", str(REPO / "topologies" / "llama-8b-1p1d.yaml"))
    assert "## host gpu-node (10.0.0.1)" in result.stdout
    assert (
        "python -m sglang.launch_server \\\n  --model-path meta-llama/Llama-3.1-8B-Instruct"
        in result.stdout
    )


def test_schema_is_json_schema_with_descriptions():
    schema = json.loads(pdkit("schema").stdout)
    assert schema["additionalProperties"] is False
    assert "prefill" in schema["properties"]
    assert schema["$defs"]["RoleSpec"]["properties"]["tp"]["description"]


def test_help_has_examples():
    assert "pdkit validate topologies/local.yaml" in pdkit("--help").stdout
    commands = (
        "validate",
        "render",
        "schema",
        "up",
        "down",
        "logs",
        "provision",
        "health",
        "status",
    )
    for command in commands:
        result = pdkit(command, "--help")
        assert "Example" in result.stdout, command


def test_debug_shows_the_traceback(tmp_path):
    result = pdkit("--debug", "validate", str(tmp_path / "missing.yaml"))
    assert "Traceback" in result.stderr


def test_a_deprecated_flag_warns_with_the_replacement_and_strict_refuses_it(write_topology):
    data = base_topology()
    data["decode"]["args"] = {"disable-cuda-graph": True}
    path = str(write_topology(data))
    result = pdkit("validate", path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
    assert "warning:" in result.stderr and "decode.args.disable-cuda-graph" in result.stderr
    assert "--disable-cuda-graph is deprecated in SGLang 0.5.23" in result.stderr
    assert (
        "cuda-graph-backend-decode: disabled and cuda-graph-backend-prefill: disabled"
        in result.stderr
    )
    strict = pdkit("validate", path, "--strict")
    assert strict.returncode == 1
    assert "1 problem in the topology:" in strict.stderr
    assert "decode.args.disable-cuda-graph" in strict.stderr
    # Switched off, the flag is not rendered: nothing to warn about.
    data["decode"]["args"] = {"disable-cuda-graph": False}
    quiet = pdkit("validate", str(write_topology(data)), "--strict")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_example_validates_strictly(topology):
    result = pdkit("validate", str(topology), "--strict")
    assert result.returncode == 0, result.stderr


def test_validate_checks_the_pdkit_router_options(write_topology):
    data = base_topology()
    data["router"]["args"] = {"health-interval": 0.2}
    assert pdkit("validate", str(write_topology(data))).returncode == 0
    data["router"]["args"] = {"health-intervall": 0.2}
    result = pdkit("validate", str(write_topology(data)))
    assert result.returncode == 1
    assert (
        "router.args.health-intervall: pdkit's router has no option --health-intervall. "
        "To fix: did you mean health-interval?" in result.stderr
    )


def test_up_refuses_bad_router_options_before_touching_a_host(write_topology, tmp_path):
    data = base_topology()
    data["router"]["args"] = {"no-such-option": True}
    result = pdkit("up", str(write_topology(data)), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 1
    assert "router.args" in result.stderr and "--no-such-option" in result.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("command", "args", "cli_only"),
    [("bench", BenchArgs, set(CLI_ONLY)), ("size", SizeArgs, set())],
)
def test_every_option_of_bench_and_size_is_a_field_of_its_args(command, args, cli_only):
    params = {p.name for p in get_command(app).commands[command].params}
    assert params - cli_only == {f.name for f in fields(args)}


def test_args_from_refuses_a_parameter_without_a_field_and_a_field_without_one():
    @dataclass(frozen=True)
    class Args:
        seed: int = 0

    assert args_from(Args, {"seed": 3}) == Args(seed=3)
    with pytest.raises(TypeError, match=r"no parameter for \['seed'\], no field for \['sed'\]"):
        args_from(Args, {"sed": 3})
    assert args_from(Args, {"seed": 3, "per_gpu": True}, cli_only={"per_gpu"}) == Args(seed=3)


def test_validate_upgrade_to_lists_what_changes(write_topology):
    data = base_topology()
    data["sglang_version"] = "0.5.22"
    data["decode"]["args"] = {"speculative-skip-dp-mlp-sync": True}
    result = pdkit("validate", str(write_topology(data)), "--upgrade-to", "0.5.23")
    # 0.5.23 has no --speculative-skip-dp-mlp-sync: the topology does not validate there.
    assert result.returncode == 1
    assert "is not a flag of SGLang 0.5.23" in result.stderr
    data["decode"]["args"] = {}
    result = pdkit("validate", str(write_topology(data)), "--upgrade-to", "0.5.23")
    assert result.returncode == 0, result.stderr
    assert "upgrade SGLang 0.5.22 -> 0.5.23" in result.stdout
    assert "--enable-tf32-matmul: default False -> None" in result.stdout
    assert "provisioning: sglang_kernel 0.4.9 -> 0.4.10." in result.stdout


def test_a_ctrl_c_once_the_command_is_over_leaves_its_exit_status():
    """A script that stops `pdkit bench` with SIGINT as it ends (its results written) found it
    dead by SIGINT: Python's shutdown had set the handler back to the signal's default."""
    script = (
        "import os, signal, sys, time\n"
        "import kit.cli.app\n"
        "cli = sys.modules['kit.cli.app']  # kit.cli's `app` is the Typer app\n"
        "cli.app = lambda: print('the command ran')\n"
        "cli.main()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.2)\n"
        "print('still exiting normally')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:2] == ["the command ran", "still exiting normally"]
