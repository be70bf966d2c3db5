"""The router's token canary on a deployment that has served for a while (`pdkit up` of a copy of
local.yaml, sim workers, one prefill and three decodes, `router.canary.interval_s` short): the
sim's `corrupt` fault turned on for one decode (its KV altered as it lands: fluent wrong tokens,
status 200, no log line) is named by the canary within two intervals, in the router's /metrics
and in `pdkit status`; the router takes that decode out and routes no request to it; the
canary's own requests never count as the users'."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import yaml

from kit.observe.prom import parse_metrics
from tests.support.local_deploy import API_KEY, pdkit
from tests.support.sim_launch import request_json

INTERVAL_S = 2.0
USERS = 8
"""Requests sent before the fault (the deployment has served) and after it."""


def _metrics(router: str) -> str:
    with urllib.request.urlopen(router + "/metrics", timeout=10) as response:
        return response.read().decode()


def _generate(router: str, text: str) -> tuple[int, str]:
    """One user request through the router: (status, the decode it went to)."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    request = urllib.request.Request(
        router + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.headers["X-PDKit-Decode"]


def _pairs(text: str, state: str) -> set[tuple[str, str]]:
    samples = parse_metrics(text, {"pdkit_lb_canary_pair"}).samples("pdkit_lb_canary_pair")
    return {
        (s.labels["prefill"], s.labels["decode"])
        for s in samples
        if s.labels["state"] == state and s.value > 0
    }


def _wait(what: str, check, deadline_s: float):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {deadline_s:g} s waiting for {what}")


def test_a_decode_that_starts_corrupting_kv_is_named_and_taken_out_within_two_intervals(
    deployment,
):
    topology, _, data = deployment
    data["hosts"][0]["gpus"] = 4
    data["prefill"]["count"] = 1
    data["decode"]["count"] = 3
    data["router"]["canary"] = {"interval_s": INTERVAL_S}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    up = pdkit("up", str(topology))
    assert up.returncode == 0, up.stdout + up.stderr
    router = f"http://127.0.0.1:{data['router']['port']}"
    decodes = [f"http://127.0.0.1:{data['decode']['port'] + i}" for i in range(3)]
    bad = decodes[2]

    # The deployment serves, and the canary's rounds find every pair agreeing.
    for i in range(USERS):
        assert _generate(router, f"before {i}")[0] == 200
    _wait(
        "a canary round with 3 pairs agreeing",
        lambda: len(_pairs(_metrics(router), "ok")) == 3,
        4 * INTERVAL_S,
    )

    status, answer = request_json(bad + "/sim/fault", {"fault": "corrupt"})
    assert status == 200, answer
    corrupted_at = time.monotonic()
    wrong = _wait(
        "the canary naming the corrupt decode",
        lambda: _pairs(_metrics(router), "wrong"),
        4 * INTERVAL_S,
    )
    named_s = time.monotonic() - corrupted_at
    assert {d for _, d in wrong} == {bad}
    round_s = parse_metrics(_metrics(router), {"pdkit_lb_canary_round_seconds"}).total(
        "pdkit_lb_canary_round_seconds"
    )
    assert named_s <= 2 * INTERVAL_S + (round_s or 0) + 0.5, named_s
    text = _metrics(router)
    assert re.search(
        rf'pdkit_lb_worker_out\{{reason="canary",role="decode",worker="{bad}"\}} 1\.0', text
    ), text

    # The router routes no user request to it; its requests are none of the canary's.
    after = [_generate(router, f"after {i}") for i in range(USERS)]
    assert all(status == 200 for status, _ in after)
    assert bad not in {decode for _, decode in after}
    text = _metrics(router)
    served = parse_metrics(text, {"pdkit_lb_requests_total"}).total(
        "pdkit_lb_requests_total", route="/generate"
    )
    assert served == 2 * USERS  # the canary's rounds are not the users' requests

    shown = pdkit("status", str(topology), "--json")
    report = json.loads(shown.stdout)
    assert [list(pair) for pair in report["router"]["canary_wrong"]] == [[p, bad] for p, _ in wrong]
    named = f"token canary: prefill {next(iter(wrong))[0]} x decode {bad} gives other tokens"
    assert any(p["cause"].startswith(named) for p in report["problems"]), report["problems"]
