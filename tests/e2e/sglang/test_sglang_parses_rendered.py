"""Every rendered SGLang argv of every example topology, rendered for each supported SGLang
version, parses with that version's own parser, and none uses a flag SGLang deprecates (its
deprecated-flag actions stay silent)."""

from __future__ import annotations

import pytest

from kit.plan.resolve import resolve
from kit.sglang.catalog import supported_versions
from tests.conftest import TOPOLOGIES
from tests.oracles.sglang_parser import parse_with_sglang


@pytest.mark.parametrize("version", supported_versions())
def test_every_rendered_argv_parses_with_sglang(version):
    cases = [
        (f"{topology.stem}/{w.name}", list(w.command.args))
        for topology in TOPOLOGIES
        for w in resolve(topology, sglang_version=version).workers
    ]
    results = parse_with_sglang([argv for _, argv in cases], version)
    failures = [
        (name, r["error"]) for (name, _), r in zip(cases, results, strict=True) if not r["ok"]
    ]
    assert not failures
    deprecated = [
        (name, r["deprecations"])
        for (name, _), r in zip(cases, results, strict=True)
        if r["deprecations"]
    ]
    assert not deprecated
    for (name, argv), result in zip(cases, results, strict=True):
        parsed = result["args"]
        assert parsed["disaggregation_mode"] == argv[argv.index("--disaggregation-mode") + 1], name
        assert parsed["port"] == int(argv[argv.index("--port") + 1]), name


def test_the_parser_reports_a_deprecated_flag():
    """The check above can fail: the old attention-DP spelling is reported, with SGLang's
    replacement."""
    argv = ["--model-path", "m", "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
    [result] = parse_with_sglang([argv])
    assert result["ok"]
    [message] = result["deprecations"]
    assert "--enable-dp-attention" in message and "--attn-dp-size" in message
