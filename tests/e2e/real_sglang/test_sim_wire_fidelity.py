"""The sim against the real SGLang 0.5.23, on the wire: one real colocated server (CPU, the tiny
model) and one sim worker of the same model get the request corpus (tests/oracles/
request_corpus.py, its `default` server's cases) and the info endpoints; status codes, content
types, the JSON shape (keys and value kinds), a stream's chunk format, the error messages' subject
and the `/metrics` families and labels must match, or the difference is in KNOWN with its reason
(and in docs/sim.md's table). A new difference fails the test; so does a KNOWN one no longer seen.
The log lines pdkit waits on are checked against the real server's too.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO
from tests.oracles.request_corpus import CASES, Case
from tests.support.ports import free_port
from tests.support.real_sglang import RealServer
from tests.support.sim_launch import SimProcess
from tests.support.wire import differences, metric_labels, send

# Start-up (30-110 s) and the corpus at the tiny model's CPU speed on a loaded machine.
pytestmark = pytest.mark.timeout(900)

CONTEXT = ["--context-length", "128"]
"""Both servers (the real one's flags are the `wire` server's of real_sglang/conftest.py): a
request with no output bound (max_tokens null) then ends within seconds on the real one (the
tiny model never ends on its own); the corpus's default-server cases are short."""

FAST = {"PDKIT_SIM_LOAD_SECONDS": "0.2", "PDKIT_SIM_SEED": "1"}

NOT_SENT = {
    "chat-max-completion-tokens-zero": "SGLang takes max_completion_tokens 0 as no limit "
    "(`max_completion_tokens or max_tokens`, entrypoints/openai/protocol.py:1214): the tiny "
    "model, which never ends on its own, generates to the context, minutes on this CPU",
    # What kills the real server (the scheduler process dies, and with it the server): kept
    # off the one server the module shares; each is a row of docs/sim.md's table.
    "gen-empty-text": "a prompt that tokenizes to no token (the tiny tokenizer adds no BOS) "
    "crashes SGLang's scheduler: RuntimeError: cannot reshape tensor of 0 elements",
}
VOCAB_SHIFT = 990
"""The corpus's input ids (1000..) are Llama-3.1's; the tiny model has 562 tokens, and SGLang
does not check ids against the vocabulary (an id past it kills the scheduler: IndexError in the
embedding), so ids >= 1000 are sent as id - 990."""

INFO = (
    "/health",
    "/health_generate",
    "/model_info",
    "/server_info",
    "/v1/models",
    "/v1/loads",
    "/get_model_info",
    "/get_server_info",
    "/flush_cache",
)

TIMING_KEYS = (
    "api_server_dispatch_finish_ts",
    "cached_tokens_details",
    "decode_throughput",
    "dp_rank",
    "first_token_latency",
    "forward_entry_time",
    "prefill_finished_time",
    "queue_time",
    "request_finished_ts",
    "request_received_ts",
    "response_sent_to_client_ts",
    "storage_prefetch_wait",
    "storage_staging_wait",
    "weight_versions",
)

# pattern (`*` = anything) over `CASE|ASPECT|DETAIL` -> why the sim differs. Each is a row of
# docs/sim.md's table "Measured differences from SGLang on the wire", with the same words.
KNOWN: dict[str, str] = {
    **{
        f"gen-*|*|*meta_info.{key} only in real": "SGLang's per-request timing and bookkeeping "
        "in meta_info; pdkit reads none of it"
        for key in TIMING_KEYS
    },
    "gen-batch-params-count-mismatch|*": "SGLang indexes past the list: 500 text/plain; the sim "
    "answers 400 naming the field",
    "gen-text-not-string|body|*": "SGLang answers FastAPI's 400 in OpenAI's error shape "
    '(object/message/type/param/code), the sim {"error": ...}; same status',
    "gen-seed-out-of-range|*": "SGLang's error is a bare string under `error` that does not name "
    "the field; the sim's names sampling_seed",
    "gen-max-new-zero|body|$.output_ids[] only in sim": "with max_new_tokens 0 SGLang returns no "
    "output id, the sim still the prefill's one",
    "cmp-n-zero|*": "SGLang refuses n=0 on /v1/completions with 400; the sim answers 200",
    "cmp-*|body|$.metadata.weight_versions only in real": "SGLang's weight-version bookkeeping",
    "chat-*|body|$.metadata.weight_versions only in real": "SGLang's weight-version bookkeeping",
    "cmp-*|body|$.usage.completion_tokens_details only in real": "SGLang's usage detail "
    "(null here)",
    "chat-*|*|$.usage.completion_tokens_details only in real": "SGLang's usage detail (null here)",
    "chat-*|body|$.choices[].message.tool_calls only in sim": "SGLang leaves tool_calls out "
    "when there are none; the sim writes null",
    "cmp-stream-usage|last-chunk|$.usage.prompt_tokens_details only in sim": "the sim's usage "
    "chunk carries prompt_tokens_details: null",
    "chat-stream-usage|first-chunk|*": "SGLang's first chat chunk has delta.reasoning_content "
    "and no usage key; the sim's has usage: null",
    "/model_info|body|$.embedding only in real": "SGLang 0.5.23's model_info field for "
    "embedding models",
    "/get_model_info|body|$.embedding only in real": "the same (deprecated route)",
    "/server_info|body|$.engine only in sim": "pdkit's own fields: engine, ignored flags, sim "
    "state (status shows the engine)",
    "/server_info|body|$.ignored only in sim": "pdkit's own fields",
    "/server_info|body|$.sim only in sim": "pdkit's own fields",
    "/server_info|body|$.internal_states[].* only in sim": "the sim's internal_states carry "
    "the scheduler's load figures, SGLang's on CPU do not",
    "/get_server_info|body|*only in sim": "the same (deprecated route)",
    "/server_info|body|$.* only in real": "SGLang lists every server argument (about 400); the "
    "sim those it honours (the rest under `ignored`)",
    "/get_server_info|body|*only in real": "the same (deprecated route)",
    "/v1/loads|body|$.accelerator real null sim str": "SGLang on CPU names no accelerator; the "
    "sim names the GPU it emulates",
    "/v1/loads|body|$.loads[].decode_moments only in real": "SGLang's decode-length moments",
    "/flush_cache|content-type|*": "SGLang's /flush_cache answers with no content type",
    "cmp-logprobs-negative|body|$.choices[].logprobs.top_logprobs[] only in sim": (
        "with logprobs -1 SGLang gives empty top_logprobs, the sim one entry per token"
    ),
    "chat-max-tokens-huge|message|*": (
        "with this test's 128-token context both refuse with the same status but not with the "
        "corpus's words, written for a 131072-token context"
    ),
    "*server_info|body|$*.max_running_requests real null sim number": (
        "SGLang reports the flag's value (unset: null), the sim the limit it resolved"
    ),
    "*server_info|body|$.max_total_tokens real number sim null": (
        "the sim is not given the CPU profile's --max-total-tokens (its KV pool is the "
        "emulated GPU's)"
    ),
    "*server_info|body|$.random_seed real number sim null": (
        "SGLang draws and reports a seed when none is given; the sim reports the flag"
    ),
    "/metrics|family|* only in real": "families the sim does not model (CUDA graphs, speculative "
    "decoding, SWA/Mamba pools, routing keys, HTTP counters, process CPU, ...); the ones pdkit "
    "reads are modelled",
    "/metrics|family|sglang:kv_transfer_* only in sim": "the sim registers the KV-transfer "
    "histograms on every role; SGLang only on PD roles",
    "/metrics|family|sglang:num_*_failed_reqs_total only in sim": "the same for the PD failure "
    "counters",
    "/metrics|family|sglang:num_aborted_requests_total only in sim": "the sim counts aborts on "
    "every role",
    "/metrics|family|pdkit_sim:* only in sim": "the sim's own figures",
    "/metrics|labels|sglang:* real+[] sim+['dp_rank']": "the sim labels its per-rank gauges "
    "with dp_rank even with one DP rank; SGLang only with DP attention",
    "/metrics|labels|sglang:num_retracted_reqs real+['pid'] sim+['dp_rank']": "SGLang labels "
    "this gauge with the scheduler's pid",
}


# Differences of values that show in the shape and come and go between runs (the real model's
# greedy choice can change with its batch): listed, not required to be seen.
SOMETIMES: dict[str, str] = {
    "*|body|$.choices[].matched_stop real number sim null": "the tiny model ended on its EOS "
    "(a value, not a shape: the sim's answers end at their drawn length)",
    "gen-stream|first-chunk|$.meta_info.*": "SGLang coalesces a short stream's tokens when it "
    "runs ahead of its output: the first chunk may already be the last (finish_reason, "
    "e2e_latency set)",
}


def _payload(case: Case) -> str:
    text = case.payload
    return re.sub(r"\b1\d{3}\b", lambda m: str(int(m.group()) - VOCAB_SHIFT), text)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, real_model, real_servers):
    folder = tmp_path_factory.mktemp("wire")
    model = real_model
    real = real_servers.get("wire")  # the session's (test_real_sglang.py launches it early)
    assert real.argv[-3:] == ["--enable-metrics", *CONTEXT]
    sim = SimProcess(
        [
            "--model-path",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--enable-metrics",
            *CONTEXT,
        ],
        env=FAST,
        log_dir=folder,
    ).start()
    try:
        real.wait_ready()
        sim.wait_ready(120)
        yield real, sim
    finally:
        sim.stop()


def _observed(real: RealServer, sim: SimProcess) -> list[str]:
    found: list[str] = []
    for case in CASES:
        if case.server != "default" or case.name in NOT_SENT:
            continue
        payload = _payload(case)
        answers = [send(url + case.endpoint, "POST", payload) for url in (real.url, sim.url)]
        found += differences(case.name, *answers, names=case.names)
        assert real.alive(), f"{case.name} killed the real server:\n{real.log()[-3000:]}"
    for path in INFO:
        found += differences(path, send(real.url + path), send(sim.url + path))
    real_metrics = metric_labels(send(real.url + "/metrics").text)
    sim_metrics = metric_labels(send(sim.url + "/metrics").text)
    for name in sorted(set(real_metrics) | set(sim_metrics)):
        if name not in sim_metrics:
            found.append(f"/metrics|family|{name} only in real")
        elif name not in real_metrics:
            found.append(f"/metrics|family|{name} only in sim")
        elif real_metrics[name] != sim_metrics[name]:
            only_real = sorted(real_metrics[name] - sim_metrics[name])
            only_sim = sorted(sim_metrics[name] - real_metrics[name])
            found.append(f"/metrics|labels|{name} real+{only_real} sim+{only_sim}")
    return found


def _matches(difference: str, pattern: str) -> bool:
    """`*` matches anything; every other character itself (brackets too)."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), difference) is not None


def test_the_sim_answers_like_sglang_or_the_difference_is_listed(servers):
    found = _observed(*servers)
    new = [d for d in found if not any(_matches(d, p) for p in (*KNOWN, *SOMETIMES))]
    stale = [p for p in KNOWN if not any(_matches(d, p) for d in found)]
    assert not new, "differences not in KNOWN (fix the sim, or list them with the reason):\n" + (
        "\n".join(new)
    )
    assert not stale, "KNOWN differences no longer seen (remove them):\n" + "\n".join(stale)


def test_every_known_difference_is_in_the_sims_docs():
    docs = " ".join((REPO / "docs" / "sim.md").read_text().split())
    reasons = {*KNOWN.values(), *SOMETIMES.values(), *NOT_SENT.values()}
    missing = [why for why in reasons if " ".join(why.split()) not in docs]
    assert not missing, f"docs/sim.md's table lacks these reasons: {missing}"


READY = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$"
)


def test_the_readiness_line_is_sglangs_own(servers):
    real, sim = servers
    for who, log in (("real", real.log()), ("sim", sim.log())):
        assert any(READY.match(line) for line in log.splitlines()), f"{who}:\n{log[-2000:]}"
