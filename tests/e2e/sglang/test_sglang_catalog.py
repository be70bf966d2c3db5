"""The shipped flag catalog and the parse tool agree with the real SGLang parser."""

from __future__ import annotations

import json

import pytest

from kit.sglang.catalog import load_catalog, supported_versions
from tests.oracles.sglang_parser import CATALOG_TOOL, REPO_ROOT, parse_with_sglang, run_sglang_tool

CATALOG_DIR = REPO_ROOT / "kit" / "sglang" / "catalogs"

# SGLang docs, one host 1P1D: the prefill server.
DOCS_PREFILL = [
    "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
    "--disaggregation-mode", "prefill",
    "--port", "30000",
    "--disaggregation-ib-device", "mlx5_roce0",
]  # fmt: skip


@pytest.mark.parametrize("version", supported_versions())
def test_shipped_catalog_equals_one_generated_from_sglang(version):
    path = CATALOG_DIR / f"{version}.json"
    done = run_sglang_tool(CATALOG_TOOL, "--check", str(path), version=version)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-2000:]}"


def test_check_reports_a_stale_catalog(tmp_path):
    stale = json.loads((CATALOG_DIR / "0.5.23.json").read_text(encoding="utf-8"))
    del stale["options"]["--page-size"]
    stale["options"]["--tp-size"]["default"] = 2
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale), encoding="utf-8")

    done = run_sglang_tool(CATALOG_TOOL, "--check", str(path))

    assert done.returncode == 1
    assert "+ --page-size" in done.stdout
    assert "~ --tp-size.default: file 2 -> SGLang 1" in done.stdout


def test_catalog_knows_what_the_parser_accepts_and_refuses():
    catalog = load_catalog("0.5.23")
    prefill, removed, bad_mode, alias = parse_with_sglang(
        [
            DOCS_PREFILL,
            ["--model-path", "m", "--cuda-graph-max-bs", "8"],
            ["--model-path", "m", "--disaggregation-mode", "both"],
            ["--model", "m", "--tensor-parallel-size", "2", "--disaggregation-mode", "decode"],
        ]
    )

    assert prefill["ok"], prefill["error"]
    assert prefill["error"] is None
    assert prefill["args"]["disaggregation_mode"] == "prefill"
    assert prefill["args"]["port"] == 30000
    assert prefill["args"]["disaggregation_ib_device"] == "mlx5_roce0"
    assert prefill["args"]["tp_size"] == 1

    assert not removed["ok"]
    assert "ambiguous option: --cuda-graph-max-bs" in removed["error"]
    assert catalog.lookup("cuda-graph-max-bs") is None

    assert not bad_mode["ok"]
    assert "invalid choice: 'both'" in bad_mode["error"]
    mode = catalog.lookup("disaggregation-mode")
    assert mode is not None
    assert catalog.check_value(mode, "both") is not None

    assert alias["ok"], alias["error"]
    assert alias["args"]["tp_size"] == 2
    assert alias["args"]["disaggregation_mode"] == "decode"
    tp = catalog.lookup("--tensor-parallel-size")
    assert tp is not None and tp.dest == "tp_size"


def test_every_catalog_default_matches_the_parsed_default():
    """A bare argv yields each flag's catalog default (what the validator assumes when unset)."""
    catalog = load_catalog("0.5.23")
    (bare,) = parse_with_sglang([["--model-path", "m"]])
    assert bare["ok"], bare["error"]
    parsed = bare["args"]
    mismatched = {
        spec.flag: (spec.default, parsed[spec.dest])
        for spec in catalog
        if spec.dest in parsed
        and spec.action == "store"
        and spec.flag != "--model-path"
        and parsed[spec.dest] != spec.default
    }
    assert mismatched == {}
