"""pdkit's router passes a worker's refusal through unchanged: a client sees the same status and
body through `python -m kit.lb` as from the worker itself.

A prefill and a decode sim worker (PD over Mooncake) behind the router; each body, an invalid
one from the request corpus (tests/request_corpus.py), goes to the decode worker directly and
through the router, which sends it to both workers with the bootstrap fields added.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import REPO
from tests.request_corpus import CASES, MODEL, SERVERS
from tools.sim_launch import SimProcess, free_port, worker_argv

pytestmark = pytest.mark.e2e

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
    bootstrap = free_port()
    short = SERVERS["short"]
    prefill = SimProcess(
        worker_argv(
            port=free_port(), mode="prefill", bootstrap_port=bootstrap, model=MODEL, extra=short
        ),
        env=SIM_ENV,
    )
    decode = SimProcess(
        worker_argv(
            port=free_port(),
            mode="decode",
            model=MODEL,
            extra=[*short, "--base-gpu-id", "1"],
        ),
        env=SIM_ENV,
    )
    lb_port = free_port()
    lb = None
    try:
        prefill.start()
        decode.start()
        prefill.wait_ready()
        decode.wait_ready()
        lb = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kit.lb",
                "--prefill",
                prefill.url,
                str(bootstrap),
                "--decode",
                decode.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(lb_port),
                "--health-interval",
                "0.05",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{lb_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/readiness", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if lb.poll() is not None or time.monotonic() > deadline:
                lb.kill()
                output = lb.communicate(timeout=10)[0].decode(errors="replace")
                pytest.fail(f"the router did not start:\n{output[-3000:]}")
            time.sleep(0.05)
        yield decode.url, url
    finally:
        if lb is not None:
            lb.kill()
            lb.wait(10)
        prefill.stop()
        decode.stop()


@pytest.mark.parametrize("name", REFUSALS)
def test_router_answers_a_refusal_as_the_worker_does(name, cluster):
    case = BY_NAME[name]
    worker_url, router_url = cluster
    direct = post(worker_url + case.endpoint, case.payload)
    via_router = post(router_url + case.endpoint, case.payload)
    assert direct[0] != 200 or direct[1] == "text/event-stream", f"the worker admitted {name}"
    assert via_router == direct
