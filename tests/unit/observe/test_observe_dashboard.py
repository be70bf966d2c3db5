"""The Grafana dashboard: a model Grafana imports, panels laid out on its 24-column grid, every
query valid PromQL scoped to the chosen deployment. (That every query returns data from a real
deployment is tests/e2e/test_monitoring_deployment.py.)"""

from __future__ import annotations

import json
import subprocess

import yaml

from kit.observe.dashboard import dashboard, dashboard_json, panel_queries, substitute
from kit.plan.resolve import resolve
from tests.conftest import REPO
from tests.support.requires import require_command


def test_the_dashboard_is_grafana_json_with_variables_and_rows():
    model = json.loads(dashboard_json())
    names = [v["name"] for v in model["templating"]["list"]]
    assert names == ["datasource", "deployment", "ttft_le", "tpot_le"]
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    assert rows == [
        "Service level",
        "Latency",
        "Load, queues and KV cache",
        "KV transfer",
        "Router",
    ]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for title, expr in panel_queries(model):
        assert 'deployment="$deployment"' in expr, title


def test_a_topology_sets_the_deployment_and_the_slo_thresholds():
    plan = resolve(REPO / "topologies" / "local.yaml")
    model = dashboard(plan)
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["deployment"]["current"]["value"] == "local"
    assert variables["ttft_le"]["current"]["value"] == "0.4"  # slo.ttft_ms 400
    assert variables["tpot_le"]["current"]["value"] == "0.04"
    assert model["uid"] == "pdkit-local"


def test_every_query_is_promql_that_prometheus_parses(tmp_path):
    require_command("promtool", "prometheus")
    queries = panel_queries(dashboard())
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"pdkit:panel_{i}", "expr": substitute(expr, "demo", "1m")}
                    for i, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout
