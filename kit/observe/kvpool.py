"""The KV pool's master (Mooncake Store, topology `kv_pool:`) as `pdkit status` shows it: up or
down, objects, used and free bytes, hits and misses, clients. `evaluate_kv_pool` is pure over
the master's /health and /metrics answers.

The master's metrics (mooncake_master 0.3.13, its `--metrics_port`): `master_key_count`
(objects), `master_allocated_bytes` and `master_total_capacity_bytes` (the mounted segments),
`master_active_clients`, the pages clients looked up (`master_batch_exist_key_items_total`
and `master_exist_key_requests_total`: HiCache asks whether a prefix's pages exist, then gets
those that do) and the gets that found a replica (`valid_get_nums_`, a counter the Prometheus
parser reads as `valid_get_nums__total`). A hit is a page got; a miss, one looked up and not
found.

A master that restarted while its clients ran (supervisord starts a killed one again at once)
holds none of what the pool held: its clients find their segments gone and mount them again
(`master_remount_segment_requests_total`), and none mounts one fresh
(`master_mount_segment_requests_total` 0; a client starting mounts fresh, and remounts on a
fresh master too, so remounts alone say nothing), so the line says the pool restarted empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kit.observe.probe import KvPoolAnswers
from kit.observe.prom import parse_metrics

KV_POOL_METRICS = (
    "master_key_count",
    "master_allocated_bytes",
    "master_total_capacity_bytes",
    "master_active_clients",
    "master_batch_exist_key_items_total",
    "master_exist_key_requests_total",
    "valid_get_nums__total",
    "master_mount_segment_requests_total",
    "master_remount_segment_requests_total",
)


@dataclass(frozen=True)
class KvPoolStatus:
    """The pool at one probe. `state` down: the master does not answer, and the workers run
    without the pool (every prefix a worker's own cache lacks is computed again)."""

    name: str
    endpoint: str
    state: Literal["up", "down"]
    cause: str = ""
    objects: int | None = None
    used_bytes: int | None = None
    capacity_bytes: int | None = None
    clients: int | None = None
    lookups: int | None = None
    hits: int | None = None
    restarted: bool = False
    """The master started after its clients (they only mounted their segments again): what
    the pool held before is gone."""

    @property
    def free_bytes(self) -> int | None:
        if self.used_bytes is None or self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.used_bytes

    @property
    def misses(self) -> int | None:
        if self.lookups is None or self.hits is None:
            return None
        return max(self.lookups - self.hits, 0)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups and self.hits is not None else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def evaluate_kv_pool(answers: KvPoolAnswers) -> KvPoolStatus:
    """The pool's status from one round's answers."""
    target = answers.target
    if not answers.health.ok:
        why = answers.health.detail or (
            f"/health {answers.health.status}" if answers.health.status else "no answer"
        )
        cause = (
            f"does not answer ({why}): the workers run without the pool, prefixes are recomputed"
        )
        return KvPoolStatus(target.name, target.endpoint, "down", cause)
    if not answers.metrics.ok:
        return KvPoolStatus(target.name, target.endpoint, "up", "its /metrics did not answer")
    m = parse_metrics(answers.metrics.body, KV_POOL_METRICS)
    return KvPoolStatus(
        name=target.name,
        endpoint=target.endpoint,
        state="up",
        objects=_int(m.total("master_key_count")),
        used_bytes=_int(m.total("master_allocated_bytes")),
        capacity_bytes=_int(m.total("master_total_capacity_bytes")),
        clients=_int(m.total("master_active_clients")),
        lookups=_int(
            (m.total("master_batch_exist_key_items_total") or 0)
            + (m.total("master_exist_key_requests_total") or 0)
        ),
        hits=_int(m.total("valid_get_nums__total")),
        restarted=not m.total("master_mount_segment_requests_total")
        and bool(m.total("master_remount_segment_requests_total")),
    )


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f} GiB"


def kv_pool_line(status: KvPoolStatus) -> str:
    """One line for `pdkit status`."""
    head = f"KV pool {status.name} ({status.endpoint}): {status.state}"
    if status.state == "down":
        return f"{head}: {status.cause}"
    rate = "-" if status.hit_rate is None else f"{status.hit_rate:.0%}"
    restarted = (
        "; restarted after its clients (they mounted their segments again): what the pool held "
        "before is gone"
        if status.restarted
        else ""
    )
    return (
        f"{head}, {status.objects if status.objects is not None else '-'} objects, "
        f"{_gib(status.used_bytes)} used of {_gib(status.capacity_bytes)} "
        f"({_gib(status.free_bytes)} free), {status.clients} clients; pages looked up "
        f"{status.lookups}: {status.hits} hits, {status.misses} misses ({rate})"
        + restarted
        + (f"; {status.cause}" if status.cause else "")
    )
