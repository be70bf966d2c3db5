"""Every rendered SGLang argv of every example topology parses with SGLang 0.5.23's own parser."""

from __future__ import annotations

from kit.plan.resolve import resolve
from tests.conftest import TOPOLOGIES
from tests.oracles.sglang_parser import parse_with_sglang


def test_every_rendered_argv_parses_with_sglang():
    cases = [
        (f"{topology.stem}/{w.name}", list(w.command.args))
        for topology in TOPOLOGIES
        for w in resolve(topology).workers
    ]
    results = parse_with_sglang([argv for _, argv in cases])
    failures = [
        (name, r["error"]) for (name, _), r in zip(cases, results, strict=True) if not r["ok"]
    ]
    assert not failures
    for (name, argv), result in zip(cases, results, strict=True):
        parsed = result["args"]
        assert parsed["disaggregation_mode"] == argv[argv.index("--disaggregation-mode") + 1], name
        assert parsed["port"] == int(argv[argv.index("--port") + 1]), name
