"""What `pdkit trace` is asked: a request id, a bootstrap room, or a bench requests.jsonl."""

from __future__ import annotations

import json

import pytest

from kit.deploy.trace import parse_wanted
from kit.errors import PdkitError


def test_ids_and_rooms_are_told_apart():
    assert parse_wanted("bench-9c7e-p0-3").request_id == "bench-9c7e-p0-3"
    assert parse_wanted("bench-9c7e-p0-3").room is None
    room = parse_wanted("7540267926668652956")
    assert room.room == 7540267926668652956 and room.request_id == "7540267926668652956"


def test_a_bench_file_names_its_slowest_request_failed_ones_first(tmp_path):
    path = tmp_path / "requests.jsonl"
    records = [
        {"request_id": "a", "ok": True, "ttft_ms": 30.0, "bootstrap_room": 1},
        {"request_id": "b", "ok": True, "ttft_ms": 90.0, "bootstrap_room": 2},
        {"request_id": "c", "ok": True, "ttft_ms": 40.0, "bootstrap_room": 3},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    wanted = parse_wanted(str(path))
    assert (wanted.request_id, wanted.room) == ("b", 2)
    assert wanted.why == f"the slowest of 3 requests in {path} (TTFT 90.0 ms)"
    records.append({"request_id": "d", "ok": False, "ttft_ms": None, "bootstrap_room": 4})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert parse_wanted(str(path)).request_id == "d"


def test_a_file_without_request_ids_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text('{"index": 0}\n')
    with pytest.raises(PdkitError, match=r"names no request id\. To fix"):
        parse_wanted(str(path))
    path.write_text("not json\n")
    with pytest.raises(PdkitError, match=r"requests.jsonl:1: not JSON"):
        parse_wanted(str(path))
