"""What a request that would kill SGLang does through pdkit's router, on sim workers that die as
SGLang 0.5.23 dies on an input id outside the vocabulary (the prefill's embedding).

With the router's checks on, the request gets a 400 and no worker sees it; the sim stays up.
With them off, the poison rule (kit.lb.poison) lets it take down one prefill, not the next.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from contextlib import ExitStack

from kit.perf.models import resolve_model
from tests.support.lb_cluster import FAST_HEALTH
from tests.support.ports import free_port
from tests.support.sim_launch import PdCluster, SimProcess, start_router, worker_argv

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


def test_with_the_checks_off_the_poison_request_takes_down_one_prefill_and_is_then_refused():
    """Validation off (`--no-validate`): the id kills the sim prefill it reaches, as it kills
    SGLang; the poison rule keeps it from the other prefill, which goes on serving."""
    boot = [free_port(), free_port()]
    prefills = [
        SimProcess(
            worker_argv(
                port=free_port(),
                mode="prefill",
                model=MODEL,
                bootstrap_port=boot[i],
                extra=["--base-gpu-id", str(i)],
            ),
            env=SIM_ENV,
        )
        for i in range(2)
    ]
    decode = SimProcess(
        worker_argv(port=free_port(), mode="decode", model=MODEL, extra=["--base-gpu-id", "2"]),
        env=SIM_ENV,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        for sim in (*prefills, decode):
            stack.enter_context(sim)
        for sim in (*prefills, decode):
            sim.wait_ready()
        argv = []
        for sim, bport in zip(prefills, boot, strict=True):
            argv += ["--prefill", sim.url, str(bport)]
        argv += ["--decode", decode.url, "--host", "127.0.0.1", "--port", str(port)]
        argv += [*FAST_HEALTH, "--no-validate", "--hold-timeout", "1"]
        log_path = prefills[0].log_dir / f"lb-{port}.log"
        lb = start_router(argv, log_path, url, 30.0)
        try:
            status, body = post(url + "/generate", POISON)
            assert status == 502, body
            assert "died while serving this request" in body["error"]["message"], body
            dead = [sim for sim in prefills if sim.proc.poll() is not None]
            assert len(dead) == 1  # one server lost, not both
            for _ in range(3):  # the other prefill serves on
                status, body = post(url + "/generate", {**POISON, "input_ids": [1, 2, 3]})
                assert status == 200, body
            status, body = post(url + "/generate", POISON)  # sent again: still not elsewhere
            assert status == 502 and "was not back" in body["error"]["message"], body
            assert [sim for sim in prefills if sim.proc.poll() is not None] == dead
            assert decode.proc.poll() is None
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                metrics = r.read().decode()
            assert "pdkit_lb_poison_suspects_total 1.0" in metrics
            access = log_path.read_text()
            assert '"cause":"poison_suspect"' in access and '"poison":"' in access
        finally:
            lb.terminate()
            lb.wait(10)
