"""The autoscaler's last decision, kept in the deployment's state folder (``autoscale.json``)
for `pdkit status`, and the same as Prometheus text for the autoscaler's own /metrics.

The record also holds the role each instance serves now: a runtime role switch changes it
without changing the Plan, and the next interval reads its metrics by it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.autoscale.decide import Decision, Mix
from kit.errors import PdkitError

FILE = "autoscale.json"
VERSION = 1


@dataclass(frozen=True)
class DecisionRecord:
    """One interval, as logged and exported: the decision and every input it was made from.

    `at`: wall time (s since the epoch); `current`/`target`: splits as ``3P3D``; goodputs in
    requests/s; `efficiency`: kit/perf's corrected factors; `applied`: what applying it did
    (None for a hold, ``dry run`` with --dry-run)."""

    at: float
    action: str
    current: str
    target: str
    reason: str
    interval: str
    observed: dict[str, float] | None
    forecast: dict[str, float] | None
    current_goodput: float | None
    target_goodput: float | None
    efficiency: dict[str, float]
    fit: str
    error: float | None
    mispredicted: int
    roles: dict[str, str] = field(default_factory=dict)
    applied: str | None = None
    dry_run: bool = False

    @classmethod
    def of(
        cls,
        decision: Decision,
        *,
        at: float,
        interval: str,
        observed: Mix | None,
        forecast: Mix | None,
        efficiency: dict[str, float],
        fit: str,
        mispredicted: int,
        roles: dict[str, str],
        applied: str | None = None,
        dry_run: bool = False,
    ) -> DecisionRecord:
        return cls(
            at=at,
            action=decision.action,
            current=decision.current.describe(),
            target=decision.target.describe(),
            reason=decision.reason,
            interval=interval,
            observed=asdict(observed) if observed else None,
            forecast=asdict(forecast) if forecast else None,
            current_goodput=decision.current_goodput,
            target_goodput=decision.target_goodput,
            efficiency=efficiency,
            fit=fit,
            error=decision.error,
            mispredicted=mispredicted,
            roles=dict(roles),
            applied=applied,
            dry_run=dry_run,
        )

    def line(self, now: float | None = None) -> str:
        """One line for `pdkit status` and the log."""
        age = f"{(now or time.time()) - self.at:.0f} s ago: " if now is not None else ""
        what = {
            "move": f"move {self.current} -> {self.target}",
            "hold": f"hold {self.current}",
            "paused": f"paused at {self.current}",
        }.get(self.action, self.action)
        text = f"{age}{what} ({self.reason})"
        if self.applied:
            text += f"; {self.applied}"
        return text


def path(state_dir: Path) -> Path:
    return state_dir / FILE


def save(state_dir: Path, record: DecisionRecord) -> None:
    """Write the record atomically (a reader never sees half a file)."""
    target = path(state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": VERSION, "last": asdict(record)}, indent=2) + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        raise PdkitError(
            f"{target}: cannot write the autoscaler's record ({exc.strerror})."
        ) from exc


def load(state_dir: Path) -> DecisionRecord | None:
    """The last decision, None when the autoscaler never ran here (or its file is unreadable:
    status must not fail over it)."""
    try:
        data = json.loads(path(state_dir).read_text())
        return DecisionRecord(**data["last"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def status_section(state_dir: Path) -> tuple[str, dict[str, object]] | None:
    """`pdkit status`'s autoscale line and JSON object, None when it never ran here."""
    found = load(state_dir)
    if found is None:
        return None
    mode = " (dry run)" if found.dry_run else ""
    return f"Autoscale{mode}: {found.line(time.time())}", asdict(found)


def metrics_text(record: DecisionRecord | None) -> str:
    """Prometheus exposition of the last decision (empty gauges before the first)."""
    if record is None:
        return "# no decision yet\n"
    lines = []

    def gauge(name: str, doc: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    def split(text: str) -> tuple[int, int]:
        p, d = text.rstrip("D").split("P")
        return int(p), int(d)

    cp, cd = split(record.current)
    tp, td = split(record.target)
    gauge(
        "pdkit_autoscale_instances",
        "Instances per role: the split when decided and the one chosen",
        [
            ('{role="prefill",split="current"}', cp),
            ('{role="decode",split="current"}', cd),
            ('{role="prefill",split="target"}', tp),
            ('{role="decode",split="target"}', td),
        ],
    )
    gauge(
        "pdkit_autoscale_predicted_goodput",
        "Predicted goodput under the SLO (requests/s)",
        [
            (f'{{split="{name}"}}', value)
            for name, value in (
                ("current", record.current_goodput),
                ("target", record.target_goodput),
            )
            if value is not None
        ],
    )
    gauge(
        "pdkit_autoscale_action",
        "The last decision (1 for its action)",
        [
            (f'{{action="{a}"}}', 1.0 if record.action == a else 0.0)
            for a in ("hold", "move", "paused")
        ],
    )
    gauge("pdkit_autoscale_decision_timestamp_seconds", "When it was made", [("", record.at)])
    if record.error is not None:
        gauge("pdkit_autoscale_forecast_error_ratio", "The forecast's error", [("", record.error)])
    gauge(
        "pdkit_autoscale_mispredicted_intervals",
        "Consecutive intervals mispredicted",
        [("", record.mispredicted)],
    )
    gauge(
        "pdkit_autoscale_efficiency",
        "kit/perf's corrected efficiency factors",
        [(f'{{factor="{k}"}}', v) for k, v in sorted(record.efficiency.items())],
    )
    for name, mix in (("observed", record.observed), ("forecast", record.forecast)):
        if mix:
            gauge(
                f"pdkit_autoscale_{name}",
                f"The {name} workload: rate (req/s) and mean lengths (tokens)",
                [(f'{{what="{k}"}}', v) for k, v in sorted(mix.items())],
            )
    return "\n".join(lines) + "\n"
