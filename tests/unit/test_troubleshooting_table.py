"""docs/troubleshooting.md's table of the failures PD users hit most (#37): one row per failure,
each backed by tests that exist, or saying plainly that pdkit cannot see it."""

from __future__ import annotations

import re

from tests.conftest import REPO


def rows() -> list[list[str]]:
    text = (REPO / "docs/troubleshooting.md").read_text()
    section = text.split("## The failures PD users hit most", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_every_failure_has_a_row_with_what_pdkit_does():
    table = rows()
    assert [int(row[0]) for row in table] == list(range(1, 22))
    assert all(len(row) == 6 for row in table), [row for row in table if len(row) != 6]


def test_each_row_is_backed_by_tests_that_exist_or_says_pdkit_cannot():
    covered = 0
    for number, _failure, _seen, does, _fix, tests in rows():
        paths = re.findall(r"`(tests/[^`]+\.py)`", tests)
        if not paths:
            assert does.startswith("cannot"), f"row {number} names no test"
            continue
        covered += 1
        missing = [p for p in paths if not (REPO / p).exists()]
        assert not missing, f"row {number}: {missing}"
    assert covered >= 15
