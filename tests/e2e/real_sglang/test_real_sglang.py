"""The whole loop against the real SGLang 0.5.23 on this machine's CPU: `pdkit up` of a copy of
topologies/local-sglang.yaml (a prefill and a decode, Mooncake over TCP, pdkit's router), then
on that one deployment the openai client through pdkit's router and through smg, `pdkit
health`/`status`/`doctor`/`trace`/`bench` from the real endpoints and logs, a live change under
load (a decode added, then restarted while the other serves), and token equality of every
prefill x decode pair with a colocated real server started beside it (the session's, from
real_sglang/conftest.py).

Real servers take 30-110 s to start on 2 loaded cores, so the module shares one deployment and
starts four servers in all (the pair, the colocated reference with them, the added decode);
the tests run in file order and each leaves the deployment as it found it, except the live
change, which comes after every test that counts on one decode.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import random
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
import yaml

from kit.deploy.services import supervisor_processes
from kit.observe.prom import parse_metrics
from kit.observe.signatures import diagnose
from kit.plan.resolve import resolve
from kit.topology.layout import HostLayout
from tests.support.local_deploy import layout, pdkit, pids, processes_of
from tests.support.ports import free_ports
from tests.support.real_sglang import (
    GREEDY,
    RealServer,
    sglang_python,
    write_topology,
)
from tests.support.requires import require_smg
from tests.support.sim_launch import request_json, start_router

# Starting real servers takes minutes here: the module's set-up (the pair and the colocated
# server) and the live change (two starts of a decode) get more than the suite's 300 s.
pytestmark = pytest.mark.timeout(900)

UP_TIMEOUT_S = 900
MODEL = "tiny-llama"
PROMPTS = ["The quick brown fox", "Hello world, this is", "Once upon a time"]
KEEP_GOING = {"ignore_eos": True}
"""SGLang's extension: the tiny model samples its EOS now and then (seen: 2 of 6 tokens, then
stop), and these tests count tokens."""


@dataclass
class Deployment:
    topology: Path
    name: str
    data: dict
    up: subprocess.CompletedProcess[str]
    colocated: RealServer
    odd_decode: RealServer
    start_s: dict[str, float] = field(default_factory=dict)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.data['router']['port']}"

    @property
    def layout(self) -> HostLayout:
        return layout(self.topology, self.name)

    def pids(self) -> dict[str, int]:
        return pids(self.topology, self.name)

    def log(self, process: str) -> str:
        return Path(self.layout.log_file(process)).read_text(errors="replace")

    def client(self, url: str | None = None) -> openai.OpenAI:
        base = url or self.router_url
        return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def real(tmp_path_factory, real_model, real_servers):
    python = sglang_python()
    folder = tmp_path_factory.mktemp("real-sglang")
    model = real_model
    name = f"real-{uuid.uuid4().hex[:8]}"
    topology, data = write_topology(folder, name, model, python)
    # Short PD timeouts, so that the real failures of the doctor test are written in seconds.
    data["transfer"]["timeouts"] = {"bootstrap_timeout_s": 30, "heartbeat_interval_s": 2}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    # The session's plain server (real_sglang/conftest.py), this module's colocated reference,
    # starts with the pair.
    colocated = real_servers.get("plain")
    # A decode whose page size is not the prefill's (1 on the CPU), for the doctor test, which
    # starts it (beside the decode the migration test killed: not five servers starting at once).
    odd = RealServer(model, folder, ["--page-size", "16"], role="decode")
    deployment = None
    try:
        started = time.monotonic()
        up = pdkit("up", str(topology), timeout=UP_TIMEOUT_S)
        up_s = time.monotonic() - started
        assert up.returncode == 0, up.stdout + up.stderr
        colocated_s = colocated.wait_ready()
        deployment = Deployment(topology, name, data, up, colocated, odd)
        deployment.start_s = {"pdkit up": up_s, "colocated": colocated_s}
        yield deployment
    finally:
        odd.stop()
        if supervisor_processes(layout(topology, name).supervisord_socket):
            pdkit("down", str(topology), timeout=300)
        if deployment is not None:
            print(f"\nreal SGLang start times (s): {deployment.start_s}")


def test_up_gates_the_real_pair_and_serves_the_openai_client(real):
    assert "1 of 1 pair(s) moved KV (1 prefill x 1 decode)" in real.up.stdout, real.up.stdout
    assert f"Serving {MODEL} at {real.router_url}" in real.up.stdout
    client = real.client()
    messages = [{"role": "user", "content": "Hello world"}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, extra_body=KEEP_GOING
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
    assert chat.usage.prompt_tokens == 9  # the tiny model's chat template (MEASUREMENTS.md)
    text = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=6, extra_body=KEEP_GOING
    )
    assert text.choices[0].text and text.usage.completion_tokens == 6
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True, temperature=0
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def _held(decode_url: str) -> int:
    """Requests the real decode holds now: running, waiting, and in its PD queues (its
    /v1/loads, asked of the scheduler at once, where /metrics gauges lag)."""
    status, body = request_json(decode_url + "/v1/loads?include=all", timeout_s=10)
    assert status == 200, body
    loads = body.get("loads", []) if isinstance(body, dict) else body
    held = 0
    for load in loads:
        pd = load.get("disaggregation") or {}
        held += load.get("num_running_reqs", 0) + load.get("num_waiting_reqs", 0)
        held += pd.get("decode_prealloc_queue_reqs", 0) + pd.get("decode_transfer_queue_reqs", 0)
    return held


def test_a_prompt_the_real_prefill_refuses_is_answered_at_once_and_the_decode_holds_nothing(
    real, tmp_path
):
    """Issue 37, failure 5: a router waiting for a decode leg whose KV never comes. The
    router's own checks are off (--no-validate), so the prompt past the model's context reaches
    the real prefill, which refuses it with a 400."""
    plan = resolve(real.topology)
    (prefill,), decode = plan.role("prefill"), plan.role("decode")[0]
    context = json.loads((Path(real.data["model"]["path"]) / "config.json").read_text())[
        "max_position_embeddings"
    ]
    body = {"input_ids": [5] * (context + 8), "sampling_params": {"max_new_tokens": 4}}
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    argv = ["--prefill", prefill.url, str(prefill.bootstrap_port), "--decode", decode.url]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--no-validate", "--no-access-log"]
    router = start_router(argv, tmp_path / "router.log", url, 60)
    try:
        assert router.poll() is None, (tmp_path / "router.log").read_text()
        direct = request_json(
            prefill.url + "/generate",
            {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
             "bootstrap_room": random.getrandbits(63)},
        )  # fmt: skip
        assert direct[0] == 400, direct
        started = time.monotonic()
        status, answer = request_json(url + "/generate", body, timeout_s=30)
        took = time.monotonic() - started
        assert (status, answer) == direct and took < 1.0, (status, answer, took)
        deadline = time.monotonic() + 10  # SGLang notices a closed connection within 4 s
        while (held := _held(decode.url)) > 0:
            assert time.monotonic() < deadline, f"the decode still holds {held} request(s)"
            time.sleep(0.2)
    finally:
        router.terminate()
        router.wait(timeout=10)


def test_health_status_and_doctor_read_the_real_endpoints(real):
    health = pdkit("health", str(real.topology))
    assert health.returncode == 0, health.stdout + health.stderr
    assert "2 workers and the pdkit router are healthy" in health.stdout

    # The real /metrics (85 families from SGLang's multiprocess dir) can take over status's
    # default 3 s on a loaded 2-core machine; a miss would blank the KV columns.
    status = pdkit("status", str(real.topology), "--json", "--timeout", "15")
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    workers = {w["name"]: w for w in report["workers"]}
    assert set(workers) == {"prefill-0", "decode-0"}
    for w in workers.values():
        assert (w["state"], w["engine"], w["version"]) == ("healthy", "sglang", "0.5.23")
        assert w["served_model"] == MODEL
        # Read from the real /v1/loads and /metrics (0.5.23 has no /get_load).
        for key in ("running", "queued", "token_usage", "gen_throughput", "health_ms"):
            assert w[key] is not None, (w["name"], key)
        assert all(v is not None for v in w["pd_queues"].values()), w["pd_queues"]
        assert w["kv"]["failed"] == 0 and w["kv"]["bootstrap_failed"] == 0, (w["name"], w)
        assert w["uptime_s"] is None  # SGLang reports no start time (the legend says so)
    prefill_kv = workers["prefill-0"]["kv"]
    assert prefill_kv["latency_ms"] > 0 and prefill_kv["transfers"] >= 1  # the gate's request
    assert workers["decode-0"]["kv"]["latency_ms"] is None  # only the prefill measures it
    table = pdkit("status", str(real.topology))
    assert "uptime (-: not reported, as by SGLang)" in " ".join(table.stdout.split()), table.stdout

    doctor = pdkit("doctor", str(real.topology), "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    (pair,) = json.loads(doctor.stdout)["pairs"]
    assert (pair["prefill"], pair["decode"], pair["state"]) == ("prefill-0", "decode-0", "ok")
    # KV time and speed from the real prefill's sglang:kv_transfer_* histograms.
    assert pair["kv_transfer_ms"] > 0 and pair["kv_speed_gb_s"] > 0 and pair["kv_transfers"] == 1


def test_trace_follows_one_request_through_the_real_logs(real):
    request = urllib.request.Request(
        real.router_url + "/v1/completions",
        data=json.dumps({"model": MODEL, "prompt": "Trace me", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        request_id = answer.headers["X-Request-Id"]
        assert answer.status == 200
    trace = pdkit("trace", str(real.topology), request_id)
    assert trace.returncode == 0, trace.stdout + trace.stderr
    assert "prefill prefill-0 -> decode decode-0" in trace.stdout
    assert "logged nothing" not in trace.stdout, trace.stdout  # both workers' lines were found
    lines = trace.stdout.splitlines()
    assert any(" prefill-0 " in line for line in lines), trace.stdout
    assert any(" decode-0 " in line for line in lines), trace.stdout


def test_a_short_bench_point_against_the_real_pair(real, tmp_path):
    bench = pdkit(
        "bench", str(real.topology), "--rate", "1", "--requests", "4", "--output-len", "8",
        "--json", "--out", str(tmp_path),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    (point,) = json.loads(bench.stdout)["points"]
    assert point["ok"] == point["requests"] >= 3  # one of the 4 warms up


def test_smg_serves_the_openai_client_through_the_real_pair(real, tmp_path):
    smg = require_smg()
    plan = resolve(real.topology)
    (prefill,), (decode,) = plan.role("prefill"), plan.role("decode")
    port, metrics = free_ports(2)
    with (tmp_path / "smg.log").open("wb") as log:
        router = subprocess.Popen(
            [smg, "launch", "--pd-disaggregation", "--prefill", prefill.url,
             str(prefill.bootstrap_port), "--decode", decode.url, "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
             str(metrics), "--worker-startup-check-interval", "1",
             "--shutdown-grace-period-secs", "1", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while request_json_or_none(url + "/readiness") != 200:
            assert router.poll() is None, (tmp_path / "smg.log").read_text()
            assert time.monotonic() < deadline, "smg never became ready"
            time.sleep(0.2)
        client = real.client(url)
        messages = [{"role": "user", "content": "Hello through smg"}]
        chat = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, extra_body=KEEP_GOING
        )
        assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
        text = client.completions.create(
            model=MODEL, prompt="Once upon", max_tokens=6, extra_body=KEEP_GOING
        )
        assert text.choices[0].text and text.usage.completion_tokens == 6
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=6, stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finally:
        router.terminate()
        try:
            router.wait(10)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()


def request_json_or_none(url: str) -> int | None:
    try:
        return request_json(url, timeout_s=2)[0]
    except OSError:
        return None


class Load:
    """Completions through the router, one after another, until stopped; every failure kept."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client, self.ok, self.failures = client, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.client.completions.create(model=MODEL, prompt="Keep going", max_tokens=4)
                self.ok += 1
            except openai.OpenAIError as exc:
                self.failures.append(repr(exc))
            time.sleep(0.5)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)


def test_a_decode_added_then_restarted_under_load_fails_no_request(real):
    before = real.pids()
    real.data["decode"]["count"] = 2
    real.topology.write_text(yaml.safe_dump(real.data, sort_keys=False))
    with Load(real.client()) as load:
        started = time.monotonic()
        grown = pdkit("up", str(real.topology), timeout=UP_TIMEOUT_S)
        real.start_s["decode added (pdkit up)"] = time.monotonic() - started
        assert grown.returncode == 0, grown.stdout + grown.stderr
        added = real.pids()
        started = time.monotonic()
        restart = pdkit("restart", str(real.topology), "decode-1", timeout=UP_TIMEOUT_S)
        real.start_s["decode-1 restarted (pdkit restart)"] = time.monotonic() - started
        assert restart.returncode == 0, restart.stdout + restart.stderr
    assert load.failures == [], load.failures
    assert load.ok > 10
    after = real.pids()
    assert set(added) == {"prefill-0", "decode-0", "decode-1", "router"}
    assert {k: added[k] for k in before} == before  # adding a decode moved nothing running
    assert after["decode-1"] != added["decode-1"]
    assert {k: v for k, v in after.items() if k != "decode-1"} == {
        k: v for k, v in added.items() if k != "decode-1"
    }


def _pd_generate(prefill_url: str, bootstrap_port: int, decode_url: str, prompt: str) -> list:
    """One greedy request through a given pair, as a PD router sends it: the same body with
    the bootstrap fields to both; the decode's output_ids."""
    body = {
        "text": prompt,
        "sampling_params": GREEDY,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(request_json, url + "/generate", body, 120) for url in (
            prefill_url, decode_url)]  # fmt: skip
        (p_status, p_out), (d_status, d_out) = (leg.result() for leg in legs)
    assert (p_status, d_status) == (200, 200), (p_out, d_out)
    return d_out["output_ids"]


def test_every_pair_gives_the_colocated_servers_tokens(real):
    plan = resolve(real.topology)
    prefills, decodes = plan.role("prefill"), plan.role("decode")
    assert (len(prefills), len(decodes)) == (1, 2)  # after the live change: 1 x 2 pairs
    reference = []
    for prompt in PROMPTS:
        status, out = request_json(
            real.colocated.url + "/generate", {"text": prompt, "sampling_params": GREEDY}, 120
        )
        assert status == 200, out
        assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
        reference.append(out["output_ids"])
    for p in prefills:
        for d in decodes:
            got = [_pd_generate(p.url, p.bootstrap_port, d.url, prompt) for prompt in PROMPTS]
            assert got == reference, f"{p.name} x {d.name} differs from the colocated server"


MIGRATED = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
"""Not longer: the more tokens after the cut, the likelier a near-tie that the continuation's
fresh prefill breaks the other way (256 tokens diverged once at the cut)."""
QUIET_S = 1.0
"""Silence after which a SIGSTOPped decode's stream is taken as cut mid-way (what was on its way
has arrived); under the router's stall timeout (2 s at least)."""


def _read_into(response, lines: queue.Queue) -> None:
    try:
        for line in response:
            lines.put(line)
    finally:
        lines.put(None)


def _events(lines: list[bytes]) -> tuple[list[dict], bool]:
    """The stream's data events and whether its `[DONE]` came."""
    data = [line[5:].strip() for line in lines if line.startswith(b"data:")]
    return [json.loads(d) for d in data if d != b"[DONE]"], b"[DONE]" in data


def _stream_with_its_decode_killed(real, body: dict) -> list[dict]:
    """The router's stream of `body` (its events), its decode SIGKILLed mid-way.
    At the first event the decode's server is SIGSTOPped; if the whole stream still arrives
    (the decode had sent every token: a loaded machine reads late), it is let go on and the
    stream tried again; else it is SIGKILLed (supervisord starts it again)."""
    names = {d.url: d.name for d in resolve(real.topology).role("decode")}
    running = real.pids()  # before the stream: asking supervisord takes a while on a busy machine
    for _ in range(3):
        request = urllib.request.Request(
            real.router_url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            decode = running[names[response.headers["X-PDKit-Decode"]]]
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_read_into, args=(response, lines), daemon=True).start()
            got: list[bytes] = []
            while not _events(got)[0]:
                line = lines.get(timeout=60)
                assert line is not None, got
                got.append(line)
            os.kill(decode, signal.SIGSTOP)
            ended = False
            try:
                while (line := lines.get(timeout=QUIET_S)) is not None:
                    got.append(line)
                ended = True
            except queue.Empty:
                pass
            if ended or _events(got)[1]:
                os.kill(decode, signal.SIGCONT)
                continue
            os.kill(decode, signal.SIGKILL)
            while (line := lines.get(timeout=120)) is not None:
                got.append(line)
            events, done = _events(got)
            assert done, got[-3:]
            return events
    raise AssertionError("the decode had sent every token before it was stopped, 3 times")


def test_a_stream_whose_decode_is_killed_continues_with_the_unbroken_tokens(real):
    """The router moves a greedy /generate stream cut by a SIGKILLed decode to the other decode
    (prompt + the ids already sent); the client's stream ends with the ids and text an unbroken
    run gives, usage counted from its own prompt."""
    ids = [17, 305, 44, 512, 8, 256, 71, 430]  # under the tiny vocabulary (562)
    status, unbroken = request_json(
        real.colocated.url + "/generate", {"input_ids": ids, "sampling_params": MIGRATED}, 120
    )
    assert status == 200, unbroken
    body = {"input_ids": ids, "sampling_params": MIGRATED, "stream": True}
    events = _stream_with_its_decode_killed(real, body)
    last = events[-1]
    assert "error" not in last, last
    assert len(events) > 1
    assert last["output_ids"] == unbroken["output_ids"]
    assert last["text"] == unbroken["text"]
    meta = last["meta_info"]
    expected = (len(ids), MIGRATED["max_new_tokens"])
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == expected
    _, page = request_json(real.router_url + "/metrics")
    # "died" when the kill came first, "stalled" when the router gave up on the stopped decode
    migrated = parse_metrics(str(page)).total("pdkit_lb_migrations_total")
    assert migrated == 1, page


LOST = "Lost connection with prefill instance"


def _wait_for(what: str, read, deadline_s: float = 90) -> str:
    """`read()`'s text once it holds `what` (fails the test past `deadline_s`)."""
    deadline = time.monotonic() + deadline_s
    while what not in (text := read()):
        assert time.monotonic() < deadline, f"never written: {what!r}\n{text[-2000:]}"
        time.sleep(1)
    return text


def _doctor_causes(real) -> dict[str, list[str]]:
    doctor = pdkit("doctor", str(real.topology), "--json", "--timeout", "20")
    assert doctor.returncode != 0, doctor.stdout
    pairs = json.loads(doctor.stdout)["pairs"]
    return {p["decode"]: [c["name"] for c in p["causes"]] for p in pairs}


def test_doctor_names_the_cause_from_what_the_real_engine_wrote(real):
    """Real failures, each matched from the line SGLang 0.5.23 itself wrote: a decode whose
    page size is not its prefill's, a prefill stopped with SIGSTOP, a killed prefill."""
    (prefill,) = resolve(real.topology).role("prefill")
    decodes = resolve(real.topology).role("decode")
    odd = real.odd_decode.launch()
    for decode in decodes:  # up (the migration test killed one) and holding the prefill's address
        _wait_healthy(decode.url)
        assert _pd_generate(prefill.url, prefill.bootstrap_port, decode.url, PROMPTS[1])

    pid = real.pids()["prefill-0"]
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait_for_new(LOST, real, [d.name for d in decodes])  # each decode's heartbeat (2 s)
        causes = _doctor_causes(real)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert causes and all("prefill_lost" in c for c in causes.values()), causes

    odd.wait_ready()
    body = {"text": PROMPTS[0], "sampling_params": GREEDY, "bootstrap_host": "127.0.0.1"}
    body |= {"bootstrap_port": prefill.bootstrap_port, "bootstrap_room": random.getrandbits(63)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        legs = [pool.submit(request_json, u + "/generate", body, 120) for u in (
            prefill.url, odd.url)]  # fmt: skip
        log = _wait_for("Page size mismatch", odd.log)
        answers = [str(leg.exception() or leg.result()) for leg in legs]
    assert "layout_mismatch" in [m.signature.name for m in diagnose(
        ("odd decode", line) for line in log.splitlines())]  # fmt: skip
    # The prefill gave up on the decode that never took the KV (bootstrap_timeout_s 30).
    assert "bootstrap_timeout" in [m.signature.name for m in diagnose(
        ("prefill answer", a) for a in answers)], answers  # fmt: skip

    for decode in decodes:
        assert _pd_generate(prefill.url, prefill.bootstrap_port, decode.url, PROMPTS[2])
    os.kill(pid, signal.SIGKILL)  # supervisord starts it again
    _wait_for_new(LOST, real, [d.name for d in decodes])
    causes = _doctor_causes(real)
    assert causes and all("prefill_lost" in c for c in causes.values()), causes


def _wait_healthy(url: str, deadline_s: float = 400) -> None:
    deadline = time.monotonic() + deadline_s
    while request_json_or_none(url + "/health") != 200:
        assert time.monotonic() < deadline, f"{url} never answered /health"
        time.sleep(1)


def _wait_for_new(what: str, real, processes: list[str], deadline_s: float = 60) -> None:
    """Until each process's log holds one more `what` line than now."""
    before = {p: real.log(p).count(what) for p in processes}
    deadline = time.monotonic() + deadline_s
    while any(real.log(p).count(what) == n for p, n in before.items()):
        assert time.monotonic() < deadline, {p: real.log(p)[-1500:] for p in processes}
        time.sleep(1)


def test_down_leaves_nothing_running(real):
    down = pdkit("down", str(real.topology), timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    deadline = time.monotonic() + 30
    while processes_of(real.name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_of(real.name) == []
    assert supervisor_processes(real.layout.supervisord_socket) is None
