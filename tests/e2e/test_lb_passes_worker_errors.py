"""pdkit's router passes a worker's refusal through unchanged: a client sees the same status and
body through `python -m kit.lb` as from the worker itself.

A prefill and a decode sim worker (PD over Mooncake) behind the router; each body, an invalid
one from the request corpus (tests/oracles/request_corpus.py), goes to the decode worker directly
and through the router, which sends it to both workers with the bootstrap fields added.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.oracles.request_corpus import CASES, MODEL, SERVERS
from tests.support.sim_launch import PdCluster

SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "50", "PDKIT_SIM_GPU": "H100-SXM"}
# One refusal of each shape: a FastAPI validation error, the /generate contract's, the serving
# classes', the tokenizer manager's (sampling params, the context), and one inside a stream.
REFUSALS = (
    "cmp-max-tokens-zero",
    "gen-unknown-sampling-param",
    "cmp-empty-prompt",
    "gen-temperature-negative",
    "chat-total-one-over",
    "chat-max-tokens-above-context-length-flag",
    "chat-stream-past-context",
    "gen-stream-past-context",
)
BY_NAME = {case.name: case for case in CASES}


def post(url: str, payload: str) -> tuple[int, str, object]:
    """(status, media type, JSON body or the list of stream events)."""
    request = urllib.request.Request(
        url, data=payload.encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, media, raw = r.status, r.headers.get_content_type(), r.read()
    except urllib.error.HTTPError as err:
        status, media, raw = err.code, err.headers.get_content_type(), err.read()
    text = raw.decode()
    if media == "text/event-stream":
        return status, media, [line for line in text.splitlines() if line.startswith("data:")]
    return status, media, json.loads(text)


@pytest.fixture(scope="module")
def cluster():
    """(decode worker URL, router URL), every process stopped afterwards."""
    with PdCluster(model=MODEL, env=SIM_ENV, extra=SERVERS["short"]) as running:
        yield running.decode.url, running.url


@pytest.mark.parametrize("name", REFUSALS)
def test_router_answers_a_refusal_as_the_worker_does(name, cluster):
    case = BY_NAME[name]
    worker_url, router_url = cluster
    direct = post(worker_url + case.endpoint, case.payload)
    via_router = post(router_url + case.endpoint, case.payload)
    assert direct[0] != 200 or direct[1] == "text/event-stream", f"the worker admitted {name}"
    assert via_router == direct
