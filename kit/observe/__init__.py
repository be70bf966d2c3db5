"""Probes and the health/status views of a deployment.

targets   Plan -> what to probe and what each process should answer
probe     concurrent, bounded HTTP probing (aiohttp): raw answers per round
prom      Prometheus text: sums, histograms (quantiles, SLO shares), counter rates
worker    evaluate one worker's answers -> WorkerStatus (pure)
router    evaluate the router's answers -> RouterStatus (pure)
report    one round -> Report: statuses, the router's view against the probes, problems
view      Report -> rich tables (status) and lines (health)
run       the `pdkit health` / `pdkit status` commands
doctor    one real PD request per prefill x decode pair (`pdkit doctor`, `pdkit up`'s gate)
signatures known log lines of SGLang, Mooncake and UCX/NIXL -> cause and fix (pure)
doctor_view the matrix, each failure's cause, the KV cost against the TTFT objective
"""

from __future__ import annotations

from kit.observe.probe import Fetched, Prober, RouterAnswers, WorkerAnswers
from kit.observe.report import Finding, Report, build_report, report_to_json
from kit.observe.router import RouterStatus, evaluate_router
from kit.observe.run import ProbeOptions, health, probe_once, status, watch_reports
from kit.observe.targets import Targets, targets_from_plan
from kit.observe.worker import WorkerStatus, evaluate_worker

__all__ = [
    "Fetched",
    "Finding",
    "ProbeOptions",
    "Prober",
    "Report",
    "RouterAnswers",
    "RouterStatus",
    "Targets",
    "WorkerAnswers",
    "WorkerStatus",
    "build_report",
    "evaluate_router",
    "evaluate_worker",
    "health",
    "probe_once",
    "report_to_json",
    "status",
    "targets_from_plan",
    "watch_reports",
]
