"""The batch script: the Plan's launch lines, one step per instance, node addresses resolved on
the nodes at run time; byte-identical for one Plan."""

from __future__ import annotations

import os
import subprocess

from kit.plan.resolve import resolve
from kit.plan.shell import plan_to_shell
from kit.slurm.script import batch_script, sbatch_options, shell_word
from tests.conftest import REPO

TOPOLOGY = REPO / "topologies" / "local-slurm.yaml"
GOLDEN = REPO / "tests" / "golden" / "local-slurm.sbatch"


def test_the_script_matches_its_golden_file():
    text = batch_script(resolve(TOPOLOGY)).replace(str(REPO), "<repo>")
    if os.environ.get("PDKIT_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_the_script_is_valid_bash():
    result = subprocess.run(
        ["bash", "-n"],
        input=batch_script(resolve(TOPOLOGY)),
        text=True,
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_a_placeholder_address_becomes_its_nodes_variable():
    assert shell_word("198.18.0.2") == '"${PDKIT_ADDR_1}"'
    assert shell_word("http://198.18.0.1:30000") == '"http://${PDKIT_ADDR_0}:30000"'
    assert shell_word('{"a": "198.18.1.1"}') == '"{\\"a\\": \\"${PDKIT_ADDR_250}\\"}"'
    assert shell_word("198.18.0.10") == '"${PDKIT_ADDR_9}"'
    assert shell_word("a b") == "'a b'"


def test_every_launch_line_is_the_plans_with_addresses_as_variables():
    plan = resolve(TOPOLOGY)
    script = batch_script(plan)
    assert "198.18." not in script
    # the address probe, the preflight and the step loop
    assert script.count("srun --overlap") == 3
    for name in ("prefill-0", "prefill-1", "decode-0", "router"):
        assert f"pdkit_keep {name} " in script
    # the 2-node decode is one step over two nodes, a rank per node
    assert 'pdkit_keep decode-0 2 "${PDKIT_NODE_1},${PDKIT_NODE_2}"' in script
    assert "--node-rank 1" in script and "--dist-init-addr" in script
    assert "198.18.0.2" in plan_to_shell(plan)  # the Ansible view keeps the Plan's values


def test_the_allocation_asks_for_what_the_topology_says():
    plan = resolve(TOPOLOGY)
    assert plan.slurm is not None
    options = sbatch_options(plan, plan.slurm)
    assert "--nodes=3" in options and "--gpus-per-node=2" in options
    assert "--partition=debug" in options and "--time=02:00:00" in options
    assert "--job-name=pdkit-local-slurm" in options
    extra = plan.slurm.model_copy(
        update={"account": "ml", "constraint": "h100", "nodelist": ("a", "b", "c")}
    )
    options = sbatch_options(plan, extra)
    assert {"--account=ml", "--constraint=h100", "--nodelist=a,b,c"} <= set(options)


def test_the_preflight_checks_the_environment_and_the_gpus_before_any_step():
    script = batch_script(resolve(TOPOLOGY))
    preflight = script.index("bash -c pdkit_preflight")
    assert 'python -c "import kit"' in script and "import sglang" not in script
    assert '[ "$gpus" -ge 2 ]' in script
    assert preflight < script.index(".nodes") < script.index("pdkit_keep prefill-0")
