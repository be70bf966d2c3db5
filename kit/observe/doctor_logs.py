"""What the workers' logs say beyond the pairs `pdkit doctor` probed: known failure lines
(`kit.observe.signatures`) in every worker's log tail, even when every pair passes now.

A transfer that timed out under load ("timed out after 300s in KVPoll.WaitingForInput") leaves
its line in the log, while doctor's one request per pair, sent to an idle cluster, passes: the
cause is then the load, not the path, and the setting to raise is named (`UNDER_LOAD`).
Pure apart from the caller's log reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kit.errors import PdkitError
from kit.observe.doctor import LogReader
from kit.observe.signatures import Match, diagnose
from kit.topology.plan_types import Plan

UNDER_LOAD = {
    "transfer_timeout": "the pairs pass now, so transfers timed out under load (queued behind "
    "others, or the transfer threads busy): raise transfer.timeouts.waiting_timeout_s "
    "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, default 300 s) and "
    "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE in the roles' env, or add decode capacity",
    "bootstrap_timeout": "the pairs pass now, so prefill requests waited too long for a decode "
    "with free KV room (load): raise transfer.timeouts.bootstrap_timeout_s "
    "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300 s), or add decode capacity",
    "prefill_lost": "the pairs pass now: the prefill missed heartbeats for a while (busy or "
    "restarted); raise transfer.timeouts.heartbeat_max_failures "
    "(SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE) if it only stalls",
}
"""Signatures whose fix differs when the pairs pass now: the setting the load needs."""


@dataclass(frozen=True)
class LogFinding:
    """A known line found in `process`'s log tail, `count` times."""

    process: str
    match: Match
    count: int

    def lines(self, pairs_ok: bool) -> list[str]:
        s = self.match.signature
        fix = UNDER_LOAD.get(s.name) if pairs_ok else None
        return [
            f"  {self.process}: {s.name} ({self.count} line(s)): {s.cause}.",
            f"    To fix: {fix or s.fix}.",
            f"    {self.match.line[:240]}",
        ]


def log_findings(plan: Plan, read: LogReader) -> list[LogFinding]:
    """Every worker's known failure lines, one finding per signature and process (its latest
    line), in plan order; a log that cannot be read is left out."""
    out = []
    for worker in plan.workers:
        try:
            tail = read(worker.name)
        except PdkitError:
            continue
        for match in diagnose((worker.name, line) for line in tail):
            count = sum(1 for line in tail if match.signature.pattern.search(line))
            out.append(LogFinding(worker.name, match, count))
    return out


def finding_lines(findings: Sequence[LogFinding], pairs_ok: bool) -> list[str]:
    """What `pdkit doctor` prints about the logs (nothing when they hold no known line)."""
    if not findings:
        return []
    lines = [f"logs: {len(findings)} known failure line(s) in the workers' recent logs:"]
    for finding in findings:
        lines += finding.lines(pairs_ok)
    return lines
