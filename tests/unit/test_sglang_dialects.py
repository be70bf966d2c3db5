"""A dialect per SGLang version: every shipped catalog has one, every example topology
renders for each, and each spells DP as its parser takes it."""

from __future__ import annotations

import pytest

from kit.plan.resolve import resolve
from kit.sglang.catalog import UnsupportedVersion, supported_versions
from kit.sglang.dialects import DIALECTS, dialect
from tests.conftest import TOPOLOGIES

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
