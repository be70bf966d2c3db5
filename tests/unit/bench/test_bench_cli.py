"""`pdkit bench` refuses what it cannot run with a message that names the option and the fix,
before sending anything."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_pdkit

LOCAL = str(REPO / "topologies" / "local.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [LOCAL],
            "choose one load: --rate R, --rates R1,R2, --search or --concurrency N (got none)",
        ),
        ([LOCAL, "--rate", "1", "--search"], "(got --rate, --search)"),
        ([LOCAL, "--rates", "1,x"], "--rates '1,x': give rates above 0"),
        (["--url", "http://127.0.0.1:9", "--rate", "1"], "--url URL --model NAME"),
        ([LOCAL, "--rate", "1", "--input-len", "uniform:9"], "--input-len 'uniform:9'"),
        ([LOCAL, "--rate", "1", "--arrivals", "bursty"], "--arrivals 'bursty'"),
        ([LOCAL, "--rate", "1", "--prefix-share", "0.5"], "--prefix-share needs --prefix-groups"),
        (
            [LOCAL, "--rate", "1", "--requests", "5", "--warmup", "5"],
            "--warmup 5 leaves no request",
        ),
        (
            [LOCAL, "--rate", "1", "--trace", "/no/trace.jsonl"],
            "--trace /no/trace.jsonl: cannot read",
        ),
        (["compare", "/no/run"], "at least two run folders"),
    ],
)
def test_bad_options_are_refused_before_any_request(args, message):
    result = run_pdkit("bench", *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_compare_names_a_folder_without_a_summary(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"points": [], "slo": {}}))
    result = run_pdkit("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 1
    assert f"{tmp_path / 'b' / 'summary.json'} cannot be read" in result.stderr
