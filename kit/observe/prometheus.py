"""Ask a deployment's Prometheus (topology `monitoring:`) over its HTTP API: which targets it
scrapes and how each went (`/api/v1/targets`), and PromQL queries (`/api/v1/query`).

`pdkit up` waits until every target has been scraped once and says which are down; the
dashboard test runs every panel's query here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlencode

from kit.errors import ProbeError
from kit.observe.probe import Prober

Health = Literal["up", "down", "unknown"]


@dataclass(frozen=True)
class ScrapeHealth:
    """One target as Prometheus last scraped it: `health` up, down, or unknown (not yet
    scraped); `error` says why a scrape failed."""

    job: str
    process: str
    url: str
    health: Health
    error: str = ""


def parse_targets(body: Any) -> list[ScrapeHealth]:
    """The active targets of a `/api/v1/targets` answer, in job then process order."""
    data = body.get("data") if isinstance(body, dict) else None
    active = data.get("activeTargets") if isinstance(data, dict) else None
    if not isinstance(active, list):
        raise ProbeError("Prometheus' /api/v1/targets answer has no data.activeTargets")
    found = []
    for target in active:
        if not isinstance(target, dict):
            continue
        found_labels = target.get("labels")
        labels: dict[str, Any] = found_labels if isinstance(found_labels, dict) else {}
        health = target.get("health")
        found.append(
            ScrapeHealth(
                job=str(labels.get("job", "?")),
                process=str(labels.get("process", labels.get("instance", "?"))),
                url=str(target.get("scrapeUrl", "")),
                health=health if health in ("up", "down") else "unknown",
                error=str(target.get("lastError") or ""),
            )
        )
    return sorted(found, key=lambda t: (t.job, t.process))


async def scrape_health(prober: Prober, base_url: str) -> list[ScrapeHealth]:
    """Every target's last scrape (ProbeError when Prometheus does not answer)."""
    fetched = await prober.get(f"{base_url}/api/v1/targets?state=active")
    body = fetched.json()
    if body is None:
        raise ProbeError(f"Prometheus at {base_url} did not list its targets: {fetched.why}")
    return parse_targets(body)


async def wait_scraped(base_url: str, timeout_s: float) -> list[ScrapeHealth]:
    """Poll until every target has been scraped once (or `timeout_s` seconds passed)."""
    deadline = time.monotonic() + timeout_s
    async with Prober(timeout=2.0) as prober:
        while True:
            targets = await scrape_health(prober, base_url)
            if (targets and all(t.health != "unknown" for t in targets)) or (
                time.monotonic() >= deadline
            ):
                return targets
            await asyncio.sleep(0.5)


async def query(prober: Prober, base_url: str, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query (ProbeError with Prometheus' message when the
    query is refused)."""
    fetched = await prober.get(f"{base_url}/api/v1/query?{urlencode({'query': promql})}")
    body = fetched.json(any_status=True)
    if not isinstance(body, dict):
        raise ProbeError(f"Prometheus at {base_url} did not answer the query: {fetched.why}")
    if body.get("status") != "success":
        raise ProbeError(f"Prometheus refused {promql!r}: {body.get('error', fetched.why)}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []
