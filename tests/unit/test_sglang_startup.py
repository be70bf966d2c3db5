"""Values SGLang 0.5.23 refuses only when the server starts are refused by `pdkit validate`, at
the key that sets them, with SGLang's message and the fix."""

from __future__ import annotations

import pytest

from kit.errors import TopologyError
from kit.plan.resolve import resolve
from kit.sglang.catalog import load_catalog
from kit.sglang.startup import STARTUP_RULES
from tests.conftest import base_topology, run_pdkit
from tests.oracles.sglang_startup_cases import CASES

RULES = {rule.name: rule for rule in STARTUP_RULES["0.5.23"]}
REFUSED = "SGLang 0.5.23 refuses this when the server starts"


def problems_of(path) -> list:
    with pytest.raises(TopologyError) as info:
        resolve(path)
    return info.value.problems


def position(text: str, key: str) -> tuple[int, int]:
    """1-based line and column of the dotted `key` in block YAML written by yaml.safe_dump."""
    lines = text.splitlines()
    start, indent, found = 0, 0, -1
    for part in key.split("."):
        prefix = " " * indent + f"{part}:"
        found = next(i for i in range(start, len(lines)) if lines[i].startswith(prefix))
        start, indent = found + 1, indent + 2
    return found + 1, indent - 1


def test_every_rule_has_a_case_and_names_a_flag_of_sglang():
    catalog = load_catalog("0.5.23")
    assert len(RULES) == len(STARTUP_RULES["0.5.23"]), "rule names must be unique"
    assert {case.rule for case in CASES} == set(RULES)
    assert [name for name, rule in RULES.items() if catalog.lookup(rule.flag) is None] == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_value_is_one_problem_at_its_key_with_sglang_message_and_fix(write_topology, case):
    rule = RULES[case.rule]
    path = write_topology(case.topology("bad"))
    problems = problems_of(path)
    assert len(problems) == 1, [str(p) for p in problems]
    problem = problems[0]
    key = case.key or f"{case.role}.args.{rule.flag}"
    assert problem.key == key
    assert problem.message.startswith(REFUSED)
    assert rule.says.split("{")[0] in problem.message
    assert problem.fix == rule.fix
    assert (problem.line, problem.column) == position(path.read_text(), key)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_good_value_passes(write_topology, case):
    resolve(write_topology(case.topology("good")))


def test_value_under_defaults_is_one_problem_at_the_defaults_key_naming_both_roles(
    write_topology,
):
    data = base_topology()
    data["defaults"] = {"args": {"schedule-conservativeness": -1}}
    [problem] = problems_of(write_topology(data))
    assert problem.key == "defaults.args.schedule-conservativeness"
    assert problem.message == (
        f"{REFUSED} on prefill and decode: schedule_conservativeness must be non-negative"
    )


def test_value_under_defaults_refused_by_one_role_names_that_role(write_topology):
    data = base_topology()
    data["defaults"] = {
        "args": {"hicache-host-memory-mode": "buffer_only", "hicache-storage-backend": "file"}
    }
    [problem] = problems_of(write_topology(data))
    assert problem.key == "defaults.args.hicache-host-memory-mode"
    assert problem.message.startswith(f"{REFUSED} on decode: ")


def test_role_value_overrides_a_refused_default(write_topology):
    data = base_topology()
    data["defaults"] = {"args": {"schedule-conservativeness": -1}}
    data["prefill"]["args"] = {"schedule-conservativeness": 0.5}
    [problem] = problems_of(write_topology(data))
    assert problem.message == (
        f"{REFUSED} on decode: schedule_conservativeness must be non-negative"
    )


def test_underscore_spelling_and_alias_point_at_the_key_as_written(write_topology):
    data = base_topology()
    data["prefill"]["args"] = {"schedule_conservativeness": -1}
    data["decode"]["args"] = {"decode-context-parallel-size": 0}  # alias of --dcp-size
    path = write_topology(data)
    keys = {p.key: p for p in problems_of(path)}
    assert set(keys) == {
        "prefill.args.schedule_conservativeness",
        "decode.args.decode-context-parallel-size",
    }
    assert "--dcp-size" in keys["decode.args.decode-context-parallel-size"].message
    for key, problem in keys.items():
        assert (problem.line, problem.column) == position(path.read_text(), key)


def test_sglang_message_carries_the_values(write_topology):
    data = base_topology()
    data["prefill"]["tp"] = 2
    data["prefill"]["args"] = {"dwdp-size": 4}
    [problem] = problems_of(write_topology(data))
    assert "dwdp_size (4) must equal tp_size (2)" in problem.message


def test_wrong_type_is_reported_once_by_the_flag_check(write_topology):
    data = base_topology()
    data["prefill"]["args"] = {"schedule-conservativeness": "low"}
    [problem] = problems_of(write_topology(data))
    assert "expects a number" in problem.message


def test_validate_prints_file_line_col_key_message_and_fix(write_topology):
    data = base_topology()
    data["decode"]["args"] = {"mem-fraction-static": 1.2}
    path = write_topology(data)
    done = run_pdkit("validate", str(path))
    assert done.returncode != 0
    line, column = position(path.read_text(), "decode.args.mem-fraction-static")
    expected = (
        f"{path}:{line}:{column}: decode.args.mem-fraction-static: {REFUSED}: "
        "--mem-fraction-static 1.2 leaves no GPU memory outside the weights"
    )
    assert expected in done.stdout + done.stderr
    assert "To fix: set mem-fraction-static below 1" in done.stdout + done.stderr
