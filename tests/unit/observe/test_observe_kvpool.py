"""The KV pool's master as `pdkit status` shows it: up with its objects, bytes and hits, or
down with what that means for the workers."""

from __future__ import annotations

from kit.observe.kvpool import evaluate_kv_pool, kv_pool_line
from kit.observe.probe import Fetched, KvPoolAnswers
from kit.observe.targets import KvPoolTarget

TARGET = KvPoolTarget("kv-pool", "a", "http://10.0.0.1:9003")
METRICS = """# TYPE master_key_count gauge
master_key_count 36
# TYPE master_allocated_bytes gauge
master_allocated_bytes 73728
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes 33554432
# TYPE master_active_clients gauge
master_active_clients 2
# TYPE master_batch_exist_key_items_total counter
master_batch_exist_key_items_total 72
# TYPE master_exist_key_requests_total counter
master_exist_key_requests_total 0
# TYPE valid_get_nums_ counter
valid_get_nums_ 36
"""


def test_an_answering_master_shows_objects_bytes_and_hits():
    health = Fetched(TARGET.url + "/health", 200, '{"status":"ok"}')
    metrics = Fetched(TARGET.url + "/metrics", 200, METRICS)
    status = evaluate_kv_pool(KvPoolAnswers(TARGET, health, metrics))
    assert (status.state, status.objects, status.clients) == ("up", 36, 2)
    assert status.free_bytes == 33554432 - 73728
    assert (status.lookups, status.hits, status.misses) == (72, 36, 36)
    line = kv_pool_line(status)
    assert "36 objects" in line and "36 hits, 36 misses (50%)" in line


def test_a_master_that_does_not_answer_is_named_down_and_what_that_means():
    gone = Fetched(TARGET.url + "/health", None, failure="refused", detail="connection refused")
    status = evaluate_kv_pool(KvPoolAnswers(TARGET, gone, gone))
    assert status.state == "down"
    line = kv_pool_line(status)
    assert "kv-pool (10.0.0.1:9003): down: does not answer (connection refused)" in line
    assert "prefixes are recomputed" in line


def test_a_master_its_clients_only_mounted_again_is_named_restarted_and_empty():
    health = Fetched(TARGET.url + "/health", 200, '{"status":"ok"}')

    def status(mounts: int, remounts: int):
        text = METRICS + (
            f"master_mount_segment_requests_total {mounts}\n"
            f"master_remount_segment_requests_total {remounts}\n"
        )
        metrics = Fetched(TARGET.url + "/metrics", 200, text)
        return evaluate_kv_pool(KvPoolAnswers(TARGET, health, metrics))

    restarted = status(0, 2)
    assert restarted.restarted
    assert "; restarted after its clients (they mounted their segments again): what the pool " \
        "held before is gone" in kv_pool_line(restarted)  # fmt: skip
    # A fresh master: its clients mounted (and then remounted, as Mooncake's clients do).
    assert not status(4, 2).restarted and "restarted" not in kv_pool_line(status(4, 2))
