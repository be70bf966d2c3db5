"""`FakeWorkerProcess` (`python -m tests.support.fake_worker`): fake PD workers in a background
process, as the benchmarks use them: URLs to route to, a summary of what they saw, nothing left
running."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.fake_worker import FakeWorkerProcess


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_prefills_decodes_and_a_null_worker_in_one_process_then_stopped():
    with FakeWorkerProcess(prefills=2, decodes=1, nulls=1, bootstrap_port=7000) as fakes:
        assert [port for _, port in fakes.prefills] == [7000, 7001]
        (prefill, boot), _ = fakes.prefills
        (decode,), (null,) = fakes.decodes, fakes.nulls
        body = {
            "text": "hi",
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": boot,
            "bootstrap_room": 42,
            "sampling_params": {"max_new_tokens": 2},
        }
        with ThreadPoolExecutor(2) as pool:  # both legs at once, as a PD router sends them
            legs = [pool.submit(post, url, body) for url in (prefill, decode)]
            (p_status, _), (d_status, answer) = (leg.result() for leg in legs)
        assert (p_status, d_status, answer["text"]) == (200, 200, " t0 t1")
        assert post(null, {"text": "hi"})[0] == 200
        status, error = post(decode, {"text": "no room"})
        assert status == 400 and "bootstrap room" in error["error"]["message"]
        post(prefill, {**body, "bootstrap_room": 43, "bootstrap_port": boot + 5})
    summary = fakes.summary
    assert summary is not None
    assert summary.served == {"prefill": 2, "decode": 1, "null": 1}
    assert summary.problem_count == 1 and "bootstrap_port 7005" in summary.problems[0]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(null + "/health", timeout=2)
