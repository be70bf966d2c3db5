"""docs/ stays true: the topology reference is generated from the schema, the examples that need
no deployment are what pdkit prints today, every command and example topology is documented,
and every relative link and anchor resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.main import get_group

from kit.cli import app
from tests.conftest import REPO, TOPOLOGIES, run_pdkit
from tests.support.markdown import DOCS, anchors, blocks, examples, relative_links

COMMANDS = REPO / "docs" / "commands.md"
OFFLINE = ("pdkit validate topologies/", "pdkit render topologies/")
"""Example commands that need no deployment: the tests run them and compare the output shown."""


def test_topology_reference_is_current():
    # The generator is run as `make lint` runs it: tests never import tools/.
    result = subprocess.run(
        [sys.executable, "-m", "tools.gen_docs_reference", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_command_has_a_section_in_commands_md():
    sections = anchors(COMMANDS)
    missing = [c for c in get_group(app).commands if f"pdkit-{c}" not in sections]
    assert not missing, f"add a '## `pdkit NAME`' section to docs/commands.md for: {missing}"


def test_every_example_topology_is_in_the_topology_docs():
    text = (REPO / "docs" / "topology.md").read_text()
    missing = [p.name for p in TOPOLOGIES if f"`topologies/{p.name}`" not in text]
    assert not missing, f"add these to the table of docs/topology.md: {missing}"


@pytest.mark.parametrize(
    "example",
    # The README's render example is checked, untrimmed, by test_readme.py.
    [(p, e) for p in DOCS[1:] for e in examples(p) if e.command.startswith(OFFLINE)],
    ids=lambda pair: f"{pair[0].name}: {pair[1].command}",
)
def test_offline_example_output_is_current(example):
    path, shown = example
    result = run_pdkit(*shown.command.split()[1:])
    real = (result.stdout + result.stderr).splitlines()
    if shown.trimmed:
        assert shown.shown() == real[: len(shown.shown())], f"{path.name}: {shown.command}"
    else:
        assert shown.output == real, f"{path.name}: {shown.command}"


def test_validate_example_with_four_mistakes_is_real_output(tmp_path):
    (topology,) = [b for b in blocks(COMMANDS, "yaml") if b.body.startswith("name: my\n")]
    (shown,) = [e for e in examples(COMMANDS) if e.command == "pdkit validate my.yaml"]
    (tmp_path / "my.yaml").write_text(topology.body)
    result = subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", "validate", "my.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert shown.output == (result.stdout + result.stderr).splitlines()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(path):
    broken = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, broken
