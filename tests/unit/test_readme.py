"""The README stays true: its topology reference is generated from the schema."""

from __future__ import annotations

from tests.conftest import REPO
from tools.gen_readme_reference import updated


def test_topology_reference_is_current():
    text = (REPO / "README.md").read_text()
    assert updated(text) == text, "run .venv/bin/python -m tools.gen_readme_reference"


def test_readme_shows_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert "make up" in text and "make test" in text
