"""The README is a front page a newcomer reads in two minutes, and what it shows is real: the
1P1D topology is the example file and the render lines are what `pdkit render` prints for it."""

from __future__ import annotations

import re

from typer.main import get_group

from kit.cli import app
from tests.conftest import REPO, run_pdkit
from tests.support.markdown import blocks, examples

README = REPO / "README.md"
TOPOLOGY = "topologies/llama-8b-1p1d.yaml"


def test_readme_shows_the_two_commands():
    text = README.read_text()
    assert "make up" in text and "make test" in text


def test_readme_stays_a_front_page():
    assert len(README.read_text().splitlines()) < 200


def test_readme_topology_is_the_example_file_verbatim():
    (shown,) = blocks(README, "yaml")
    assert shown.body == (REPO / TOPOLOGY).read_text()
    assert len(shown.body.splitlines()) < 40


def test_readme_render_lines_are_what_pdkit_render_prints():
    (example,) = [e for e in examples(README) if e.command.startswith("pdkit render")]
    assert example.command == f"pdkit render {TOPOLOGY}"
    assert not example.trimmed, "the README shows the whole output"
    result = run_pdkit("render", TOPOLOGY)
    assert result.returncode == 0, result.stderr
    assert example.output == result.stdout.splitlines()


def test_readme_has_one_row_with_an_example_per_command():
    rows = re.findall(r"^\| \[`(\w+)`\]\([^)]*\) \|[^|]*\| `([^`]*)` \|$", README.read_text(), re.M)
    documented = [name for name, _ in rows]
    commands = set(get_group(app).commands)
    assert len(documented) == len(set(documented))
    missing, unknown = commands - set(documented), set(documented) - commands
    assert not missing, f"add a row to the README's command table for: {sorted(missing)}"
    assert not unknown, f"the README's command table names no such command: {sorted(unknown)}"
    for name, example in rows:
        assert example.startswith(f"pdkit {name} "), (name, example)
