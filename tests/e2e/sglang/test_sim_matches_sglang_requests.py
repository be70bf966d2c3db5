"""The sim answers every body of the request corpus (tests/oracles/request_corpus.py) as SGLang
0.5.23.

Each body goes to a sim worker over HTTP and through SGLang's own request handling
(tests/oracles/sglang_requests.py, in the SGLang venv: FastAPI's parse of SGLang's request types,
the serving classes' checks, the tokenizer manager's normalization, context-length and total-token
rules, and the sampling-params checks, with the sim's tokenizer and context length). Both must
give the same outcome: admitted (200), refused with the same HTTP status, or (a /generate
stream) refused inside a 200 stream; and a refusal's two messages must name the same thing
(the case's `names`).

What SGLang checks later, in the scheduler on the GPU host, cannot run here
(`sglang_requests.SCHEDULER_CHECKS`); for those the sim follows scheduler.py and the cases
in the corpus that reach them (the `short` server's input limit, logprob_start_len) are
admitted by SGLang's side and refused by the sim: they are listed in SCHEDULER_REFUSALS with
the line of SGLang that refuses them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from kit.perf.models import resolve_model
from tests.oracles.request_corpus import CASES, MODEL, SERVERS, SHORT, Case
from tests.oracles.sglang_parser import REPO_ROOT, run_sglang_tool
from tests.support.ports import free_port
from tests.support.sim_launch import SimProcess, worker_argv

REQUESTS_TOOL = REPO_ROOT / "tests" / "oracles" / "sglang_requests.py"
FAST = {"PDKIT_SIM_SPEED": "50", "PDKIT_SIM_LOAD_SECONDS": "0.2", "PDKIT_SIM_SEED": "1"}

# Refused by SGLang's scheduler (sglang/srt/managers/scheduler.py, handle_generate_request),
# after the tokenizer manager admitted them: the sim refuses them as the scheduler does, with
# a 400, or inside the stream for a stream (the abort is the stream's first output).
SCHEDULER_REFUSALS = {
    "gen-input-past-scheduler-limit": "validate_input_length (managers/utils.py:259)",
    "gen-stream-past-scheduler-limit": "validate_input_length (managers/utils.py:259)",
    "chat-stream-past-scheduler-limit": "validate_input_length (managers/utils.py:259)",
    "gen-logprob-start-past-prompt": "the logprob_start_len check (scheduler.py:3276)",
}


def _context_len(server: str) -> int:
    return resolve_model(MODEL).context_len if server == "default" else SHORT


def _argv(server: str, port: int) -> list[str]:
    return worker_argv(port=port, model=MODEL, extra=SERVERS[server])


@pytest.fixture(scope="module")
def sglang_answers() -> dict[str, dict[str, Any]]:
    servers = sorted(SERVERS)
    spec = [
        {
            "argv": _argv(server, 30000),
            "context_len": _context_len(server),
            "vocab_size": resolve_model(MODEL).vocab,
            "cases": [
                {"endpoint": c.endpoint, "body": c.payload} for c in CASES if c.server == server
            ],
        }
        for server in servers
    ]
    done = run_sglang_tool(REQUESTS_TOOL, stdin=json.dumps(spec))
    if done.returncode != 0:
        pytest.fail(f"{REQUESTS_TOOL.name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    answers: dict[str, dict[str, Any]] = {}
    for server, results in zip(servers, json.loads(done.stdout), strict=True):
        cases = [c for c in CASES if c.server == server]
        answers.update({c.name: r for c, r in zip(cases, results, strict=True)})
    return answers


@pytest.fixture(scope="module")
def sim_answers() -> dict[str, dict[str, Any]]:
    workers = {}
    try:
        for server in SERVERS:
            workers[server] = SimProcess(_argv(server, free_port()), env=FAST).start()
        for proc in workers.values():
            proc.wait_ready()
        return {c.name: post(workers[c.server].url + c.endpoint, c.payload) for c in CASES}
    finally:
        for proc in workers.values():
            proc.stop()


def post(url: str, payload: str) -> dict[str, Any]:
    """The worker's answer in the tool's terms: status, error message, in a stream or not."""
    request = urllib.request.Request(
        url, data=payload.encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, raw, stream = r.status, r.read(), "event-stream" in r.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        status, raw, stream = err.code, err.read(), False
    text = raw.decode(errors="replace")
    if stream:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
        errors = [_error_of(json.loads(event)) for event in events]
        error = next((e for e in errors if e is not None), None)
        return {"status": status, "error": error, "in_stream": error is not None}
    if status == 200:
        return {"status": status, "error": None, "in_stream": False}
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return {"status": status, "error": text, "in_stream": False}
    return {"status": status, "error": _error_of(body) or text, "in_stream": False}


def _error_of(body: Any) -> str | None:
    """The message of an error body or stream event (SGLang's shapes), else None."""
    if not isinstance(body, dict):
        return None
    if body.get("object") == "error":
        return str(body.get("message"))
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message"))
    if error is not None:
        return str(error)
    finish = (body.get("meta_info") or {}).get("finish_reason") or {}
    if finish.get("type") == "abort":
        return str(finish.get("message"))
    return None


def _outcome(answer: dict[str, Any]) -> str:
    if answer["in_stream"]:
        return "refused in a 200 stream"
    return "admitted" if answer["error"] is None else f"refused with {answer['status']}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sim_answers_like_sglang(case: Case, sglang_answers, sim_answers):
    sglang, sim = sglang_answers[case.name], sim_answers[case.name]
    if case.name in SCHEDULER_REFUSALS:
        assert _outcome(sglang) == "admitted", "SGLang's tokenizer manager refuses it now"
        stream = bool(case.body.get("stream"))
        sglang = {"status": 200 if stream else 400, "error": case.names, "in_stream": stream}
    if case.known_difference:
        assert _outcome(sim) != _outcome(sglang), (
            f"{case.name} is answered alike now: drop its known_difference"
        )
        return
    assert (case.names is None) == (sglang["error"] is None), (
        f"the corpus expects {'a refusal' if case.names else 'admission'}; SGLang: {sglang}"
    )
    assert _outcome(sim) == _outcome(sglang), f"sim: {sim}\nSGLang: {sglang}"
    if case.names is not None:
        assert case.names.lower() in sglang["error"].lower(), sglang["error"]
        assert case.names.lower() in sim["error"].lower(), (
            f"the sim's message does not name {case.names!r}: {sim['error']}\n"
            f"SGLang's: {sglang['error']}"
        )


def test_known_differences_are_listed_in_the_sim_docs():
    docs = (REPO_ROOT / "docs" / "sim.md").read_text()
    assert [c.name for c in CASES if c.known_difference and f"`{c.name}`" not in docs] == []
