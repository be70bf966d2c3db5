"""A dialect per SGLang version: every shipped catalog has one, every example topology
renders for each, each spells DP as its parser takes it, and every flag pdkit renders is
spelled by the dialect, live (there and not deprecated) in its version's catalog."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from kit.plan.resolve import resolve
from kit.sglang.catalog import UnsupportedVersion, supported_versions
from kit.sglang.dialects import DIALECTS, dialect
from kit.sglang.dialects.base import SPELLINGS
from kit.sglang.upgrade import changes
from kit.topology.schema import Topology
from tests.conftest import REPO, TOPOLOGIES, base_topology

VERSIONS = ("0.5.22", "0.5.23")


def test_every_catalog_has_a_dialect_and_back():
    assert sorted(DIALECTS) == supported_versions() == list(VERSIONS)


def test_an_unknown_version_names_the_supported_ones():
    with pytest.raises(UnsupportedVersion, match=r"supported: 0\.5\.22, 0\.5\.23"):
        dialect("0.4.0")


@pytest.mark.parametrize("version", VERSIONS)
def test_dp_spellings(version):
    d = dialect(version)
    assert d.parallel_flags(dp=8, dp_attention=True) == [("--attn-dp-size", "8")]
    assert d.parallel_flags(dp=2, dp_attention=False) == [("--dp-size", "2")]
    assert d.parallel_flags(dp=1, dp_attention=False) == []
    for flag in ("--attn-dp-size", "--dp-size"):
        assert d.catalog.lookup(flag) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_every_startup_rule_reads_a_flag_of_its_version(version):
    d = dialect(version)
    missing = [r.name for r in d.startup_rules if d.catalog.lookup(r.flag) is None]
    assert not missing


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_example_renders_for_every_version(topology, version):
    plan = resolve(topology, sglang_version=version)
    assert plan.sglang_version == version
    for w in plan.workers:
        assert "--enable-dp-attention" not in w.command.args


@pytest.mark.parametrize("version", VERSIONS)
def test_every_spelling_is_a_live_flag_of_its_version(version):
    d = dialect(version)
    specs = {name: d.catalog.lookup(flag) for name, flag in d.spellings.items()}
    assert [n for n, spec in specs.items() if spec is None] == []
    assert [n for n, spec in specs.items() if spec.deprecated] == []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_rendered_flag_is_a_live_flag_of_the_pinned_version(topology, version):
    plan = resolve(topology, sglang_version=version)
    catalog = dialect(version).catalog
    flags = {f[0] for w in plan.workers if w.command.module != "kit.sim" for f in w.command.flags}
    specs = {flag: catalog.lookup(flag) for flag in flags}
    assert sorted(f for f, spec in specs.items() if spec is None) == []
    assert sorted(f for f, spec in specs.items() if spec.deprecated) == []


def test_the_renderer_asks_the_dialect_for_each_spelling(monkeypatch):
    """A version that renamed a flag pdkit renders: a new spelling in its dialect is all the
    renderer needs, and the upgrade report names it."""
    old = DIALECTS["0.5.22"]
    spellings = {**SPELLINGS, "tp": "--tensor-parallel-size", "watchdog": "--watchdog"}
    monkeypatch.setitem(DIALECTS, "0.5.22", dataclasses.replace(old, spellings=spellings))
    plan = resolve(TOPOLOGIES[0].parent / "deepseek-r1-ep.yaml", sglang_version="0.5.22")
    args = plan.workers[0].command.args
    assert "--tensor-parallel-size" in args and "--tp-size" not in args
    assert "--watchdog" in args and "--watchdog-timeout" not in args
    topology = Topology.model_validate({**base_topology(), "sglang_version": "0.5.22"})
    lines = changes(topology, dialect("0.5.23"))
    assert "pdkit renders --tp-size instead of --tensor-parallel-size." in lines
    assert "pdkit renders --watchdog-timeout instead of --watchdog." in lines


def test_the_renderer_spells_no_flag_by_hand():
    source = (REPO / "kit" / "sglang" / "render.py").read_text()
    literals = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    # Docstrings may name flags; f"--{flag}" of input_files is the user's own path flags.
    assert [s for s in literals if re.fullmatch(r"--[a-z0-9-]+", s)] == []
