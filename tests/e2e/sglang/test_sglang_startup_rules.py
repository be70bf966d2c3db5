"""pdkit's start-up rules (kit/sglang/startup) agree with SGLang 0.5.23's own start-up hooks.

For every rule, the argv pdkit renders for the bad topology of its case
(tests/oracles/sglang_startup_cases.py) goes through SGLang's hooks
(tests/oracles/sglang_hooks.py, in the SGLang venv) in the order `ServerArgs.resolve_once()` and
`check_server_args()` run them: the rule's hook must refuse it, with the rule's message, at the
rule's file:line. The good topology's argv must pass every hook. So a table entry that SGLang
does not back, or whose message or source line moved, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.plan.build import build_plan
from kit.sglang.catalog import load_catalog
from kit.sglang.startup import STARTUP_RULES, launch_values
from kit.topology.load import parse_topology
from kit.topology.place import placement
from tests.oracles.sglang_parser import REPO_ROOT, run_sglang_tool
from tests.oracles.sglang_startup_cases import CASES, Case

HOOKS_TOOL = REPO_ROOT / "tests" / "oracles" / "sglang_hooks.py"
RULES = {rule.name: rule for rule in STARTUP_RULES["0.5.23"]}

# SGLang's hooks in the order arg_groups/pipeline.py runs them (those that check flags alone,
# and the resolutions later checks read), then check_server_args, which launch_server calls
# after resolution.
PIPELINE = (
    "parallel_hook.handle_deprecated_dp_attention",
    "serving_hook.handle_watermark_config",
    "hicache_hook.handle_hicache_ratio_default",
    "memory_hook.handle_offload_compatibility",
    "validation_hook.validate_prefill_decode_interval",
    "validation_hook.validate_response_store",
    "validation_hook.validate_sampling_mask_max_tokens",
    "validation_hook.handle_aux_hidden_state_capture",
    "serving_hook.handle_multimodal",
    "serving_hook.handle_ssl_validation",
    "serving_hook.handle_asr_validation",
    "serving_hook.handle_deprecated_args",
    "pd_disaggregation_hook.handle_pd_disaggregation",
    "kv_cache_hook.validate_prefill_only_disable_kv_cache_args",
    "parallel_hook.handle_decode_context_parallelism",
    "parallel_hook.handle_dwdp",
    "cuda_graph_hook.handle_cuda_graph_config",
    "hicache_hook.handle_hicache",
    "parallel_hook.handle_data_parallelism",
    "overrides._pipeline_parallel_overlap_disable",
    "pd_disaggregation_hook.handle_encoder_disaggregation",
    "serving_hook.handle_tokenizer_batching",
    "serving_hook.handle_other_validations",
    "validation_hook.check_server_args",
)

# What resolution fills in from the GPU and the model before check_server_args runs, where
# the topology leaves it unset: any valid value serves.
STAND_INS = {
    "--served-model-name": "model",
    "--page-size": "1",
    "--chunked-prefill-size": "8192",
    "--device": "cuda",
}


def _argv(case: Case, which: str) -> list[str]:
    data = case.topology(which)
    topology, _ = parse_topology(yaml.safe_dump(data, sort_keys=False), "topology.yaml")
    plan = build_plan(topology, Path("/nonexistent/pdkit-topology"), placement(topology))
    argv = next(list(w.command.args) for w in plan.workers if w.role == case.role)
    for flag, value in STAND_INS.items():
        if flag not in argv:
            argv += [flag, value]
    return argv


@pytest.fixture(scope="module")
def verdicts() -> dict[tuple[str, str], dict[str, Any]]:
    """SGLang's verdict on every case's bad and good argv, from one run of the SGLang venv."""
    runs = [(case.id, which) for case in CASES for which in ("bad", "good")]
    by_id = {case.id: case for case in CASES}
    cases = [{"argv": _argv(by_id[id_], which), "hooks": list(PIPELINE)} for id_, which in runs]
    done = run_sglang_tool(HOOKS_TOOL, stdin=json.dumps(cases))
    if done.returncode != 0:
        pytest.fail(f"{HOOKS_TOOL.name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return dict(zip(runs, json.loads(done.stdout), strict=True))


def test_every_rule_hook_is_run():
    assert {rule.hook for rule in RULES.values() if rule.hook} <= set(PIPELINE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sglang_refuses_the_bad_value_as_the_rule_says(verdicts, case):
    rule = RULES[case.rule]
    if rule.needs_gpu:
        pytest.skip(
            f"SGLang refuses this only on a GPU host, after loading the weights "
            f"(sglang/srt/{rule.source}); no hook checks mem-fraction-static"
        )
    verdict = verdicts[(case.id, "bad")]
    assert verdict["refused"], f"SGLang accepted {case.id}'s bad value"
    data = case.topology("bad")
    topology, _ = parse_topology(yaml.safe_dump(data, sort_keys=False), "topology.yaml")
    values, _ = launch_values(topology, load_catalog("0.5.23"), case.role)
    assert (verdict["hook"], verdict["source"]) == (rule.hook, rule.source), verdict["error"]
    assert rule.message(values) in verdict["error"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sglang_accepts_the_good_value(verdicts, case):
    verdict = verdicts[(case.id, "good")]
    assert not verdict["refused"], verdict
