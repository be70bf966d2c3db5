"""What a request that would kill SGLang does through pdkit's router, on sim workers that die as
SGLang 0.5.23 dies on an input id outside the vocabulary (the prefill's embedding).

With the router's checks on, the request gets a 400 and no worker sees it; the sim stays up.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from kit.perf.models import resolve_model
from tests.support.sim_launch import PdCluster

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM_ENV = {"PDKIT_SIM_LOAD_SECONDS": "0.1", "PDKIT_SIM_SPEED": "50", "PDKIT_SIM_GPU": "H100-SXM"}
POISON = {"input_ids": [1, 2, 999999999], "sampling_params": {"max_new_tokens": 4}}


def post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_an_id_outside_the_vocabulary_is_refused_and_the_sim_stays_up():
    vocab = resolve_model(MODEL).vocab
    args = ("--health-interval", "0.05", "--prompt-tokens", f"sim:{vocab}")
    with PdCluster(model=MODEL, env=SIM_ENV, lb_args=args) as cluster:
        status, body = post(cluster.url + "/generate", POISON)
        assert status == 400, body
        assert body["error"]["param"] == "input_ids" and "999999999" in body["error"]["message"]
        assert cluster.prefill.proc.poll() is None and cluster.decode.proc.poll() is None
        status, body = post(cluster.url + "/generate", {**POISON, "input_ids": [1, 2, vocab - 1]})
        assert status == 200, body
