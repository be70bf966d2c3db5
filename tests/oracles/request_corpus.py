"""Request bodies for /generate, /v1/completions and /v1/chat/completions: valid, edge and
invalid, each sent to the sim and to SGLang 0.5.23's own request handling
(tests/e2e/sglang/test_sim_matches_sglang_requests.py), which must answer them alike.

A case names its endpoint, its body (a JSON value, or `Raw` text that is not JSON), the
server it goes to (`SERVERS`: the launch flags beyond the model's), and, for a refusal, a
phrase both error messages must contain (the field, flag or rule they name). Texts are sized
by the sim's token rule (`tokens(n)`: n tokens; a chat message of `chat_tokens(n)` renders to
n prompt tokens). `known_difference` marks a case the sim answers otherwise, with the reason;
the sim's docs list it (docs/sim.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # 131072 tokens of context, vocabulary 128256
SHORT = 256  # the context of the `short` and `truncate` servers

# Launch flags per server, after the model and the address.
SERVERS: dict[str, list[str]] = {
    "default": [],
    "short": ["--context-length", str(SHORT)],
    "truncate": ["--context-length", str(SHORT), "--allow-auto-truncate"],
}

GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Raw:
    """A body sent as this text, not as JSON."""

    text: str


@dataclass(frozen=True)
class Case:
    name: str
    endpoint: str
    body: Any
    names: str | None = None  # a refusal: what both messages mention (case-insensitive)
    server: str = "default"
    known_difference: str | None = None

    @property
    def payload(self) -> str:
        """The request body as sent."""
        import json  # noqa: PLC0415

        return self.body.text if isinstance(self.body, Raw) else json.dumps(self.body)


def tokens(n: int) -> str:
    """A text of exactly n tokens for the sim's tokenizer (4 ASCII bytes a token)."""
    return "abcd" * n


# "<|user|>\n" + content + "\n<|assistant|>\n": 24 bytes around the content.
def chat_tokens(n: int) -> str:
    """Message content whose one-user-message chat renders to exactly n prompt tokens."""
    return "abcd" * (n - 6)


def user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def gen(name: str, body: Any, names: str | None = None, **kw: Any) -> Case:
    return Case(name, GENERATE, body, names, **kw)


def cmp(name: str, body: Any, names: str | None = None, **kw: Any) -> Case:
    return Case(name, COMPLETIONS, {"model": "llama", **body}, names, **kw)


def chat(name: str, body: Any, names: str | None = None, **kw: Any) -> Case:
    return Case(name, CHAT, {"model": "llama", **body}, names, **kw)


def sp(**params: Any) -> dict[str, Any]:
    """A one-token prompt with these sampling params (max_new_tokens 2 unless given)."""
    return {"text": "Hi", "sampling_params": {"max_new_tokens": 2, **params}}


HI = user("Hi")
C = SHORT
MAX_INPUT = C - 6  # SGLang's scheduler: max_req_input_len = (context - 1) - 5

CASES: tuple[Case, ...] = (
    # -- /generate: inputs and batches ---------------------------------------------------------
    gen("gen-text", sp()),
    gen(
        "gen-input-ids", {"input_ids": [1000, 1001, 1002], "sampling_params": {"max_new_tokens": 2}}
    ),
    gen("gen-batch-text", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}),
    gen(
        "gen-batch-ids",
        {"input_ids": [[1000], [1001, 1002]], "sampling_params": {"max_new_tokens": 2}},
    ),
    gen(
        "gen-batch-params-per-prompt",
        {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3}]},
    ),
    gen("gen-n2", sp(n=2)),
    gen("gen-n-zero", sp(n=0)),
    gen("gen-text-and-input-ids", {**sp(), "input_ids": [1000]}),
    gen("gen-empty-text-list", {"text": [], "sampling_params": {"max_new_tokens": 2}}),
    gen(
        "gen-batch-params-count-mismatch",
        {
            "text": ["a", "b", "c"],
            "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 2}],
        },
        known_difference=(
            "SGLang indexes past the end of the list and answers 500 (IndexError); the sim "
            "answers 400 naming sampling_params"
        ),
    ),
    gen("gen-bootstrap-room-string", {**sp(), "bootstrap_room": "7"}, "OptionalInt64OrList"),
    gen("gen-bootstrap-room-negative", {**sp(), "bootstrap_room": -1}),
    gen("gen-priority-out-of-int64", {**sp(), "priority": 2**63}, "priority"),
    gen(
        "gen-batch-n-differs",
        {"text": ["a", "b"], "sampling_params": [{"n": 2}, {"n": 3}]},
        "parallel_sample_num",
    ),
    gen("gen-no-input", {"sampling_params": {"max_new_tokens": 2}}, "text, input_ids"),
    gen("gen-empty-text", {"text": "", "sampling_params": {"max_new_tokens": 2}}),
    gen("gen-empty-input-ids", {"input_ids": []}, "input_ids"),
    gen("gen-text-not-string", {"text": 5}, "text"),
    gen("gen-body-is-a-list", [{"text": "Hi"}], "body"),
    gen("gen-invalid-json", Raw('{"text": "Hi",'), "json"),
    gen(
        "gen-unknown-field",
        {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "colour": "red"},
    ),
    gen(
        "gen-duplicate-rids",
        {"text": ["a", "b"], "rid": ["r1", "r1"], "sampling_params": {"max_new_tokens": 2}},
        "Duplicate request ID",
    ),
    gen("gen-routed-dp-rank-out-of-range", {**sp(), "routed_dp_rank": 3}, "routed_dp_rank"),
    gen("gen-stream", {**sp(), "stream": True}),
    # -- /generate: sampling params ------------------------------------------------------------
    gen("gen-max-new-zero", sp(max_new_tokens=0)),
    gen("gen-max-new-negative", sp(max_new_tokens=-1), "max_new_tokens"),
    gen("gen-max-new-huge", sp(max_new_tokens=10**9), "maximum context length"),
    gen("gen-max-new-huge-truncated", sp(max_new_tokens=10**9), server="truncate"),
    gen("gen-max-new-string", sp(max_new_tokens="8"), "expected i64"),
    gen(
        "gen-max-new-null",
        {"text": tokens(MAX_INPUT - 1), "sampling_params": {"max_new_tokens": None}},
        server="short",
    ),
    gen("gen-min-new-above-max", sp(min_new_tokens=5, max_new_tokens=2), "min_new_tokens"),
    gen("gen-temperature-negative", sp(temperature=-0.5), "temperature"),
    gen("gen-temperature-zero", sp(temperature=0)),
    gen("gen-top-p-zero", sp(top_p=0), "top_p"),
    gen("gen-top-p-above-one", sp(top_p=1.5), "top_p"),
    gen("gen-top-k-zero", sp(top_k=0), "top_k"),
    gen("gen-top-k-disabled", sp(top_k=-1)),
    gen("gen-min-p-above-one", sp(min_p=2), "min_p"),
    gen("gen-frequency-penalty-high", sp(frequency_penalty=3), "frequency_penalty"),
    gen("gen-presence-penalty-low", sp(presence_penalty=-3), "presence_penalty"),
    gen("gen-repetition-penalty-zero", sp(repetition_penalty=0), "repetition_penalty"),
    gen("gen-stop-strings", sp(stop=["\n", "the"], stop_token_ids=[2])),
    gen("gen-stop-33-strings", sp(stop=[f"s{i}" for i in range(33)]), "stop strings"),
    gen("gen-stop-not-string", sp(stop=5), "StringOrList"),
    gen("gen-unknown-sampling-param", sp(colour="red"), "unknown field `colour`"),
    gen("gen-logit-bias-out-of-vocab", sp(logit_bias={"999999999": 1.0}), "logit_bias"),
    gen("gen-seed-out-of-range", sp(sampling_seed=2**64), "sampling_seed"),
    # -- /generate: logprobs -------------------------------------------------------------------
    gen("gen-logprobs", {**sp(), "return_logprob": True, "top_logprobs_num": 2}),
    gen(
        "gen-logprob-start-past-prompt",
        {**sp(), "return_logprob": True, "logprob_start_len": 50},
        "logprob_start_len",
    ),
    # -- /generate: server features not enabled ------------------------------------------------
    gen("gen-custom-logit-processor", {**sp(), "custom_logit_processor": "{}"}, "custom logit"),
    gen("gen-return-hidden-states", {**sp(), "return_hidden_states": True}, "hidden states"),
    gen("gen-lora", {**sp(), "lora_path": "adapter"}, "LoRA"),
    # -- /generate: lengths at and past the context (256 tokens) ------------------------------
    gen(
        "gen-input-at-limit",
        {"text": tokens(MAX_INPUT - 1), "sampling_params": {"max_new_tokens": 2}},
        server="short",
    ),
    gen(
        "gen-input-past-scheduler-limit",
        {"text": tokens(MAX_INPUT), "sampling_params": {"max_new_tokens": 2}},
        "--allow-auto-truncate",
        server="short",
    ),
    gen("gen-input-equals-context", {"text": tokens(C)}, "context length", server="short"),
    gen("gen-input-past-context-truncated", {"text": tokens(2 * C)}, server="truncate"),
    gen(
        "gen-total-fits",
        {"text": tokens(100), "sampling_params": {"max_new_tokens": C - 100}},
        server="short",
    ),
    gen(
        "gen-total-one-over",
        {"text": tokens(100), "sampling_params": {"max_new_tokens": C - 99}},
        "maximum context length",
        server="short",
    ),
    gen("gen-long-prompt-default-max-new", {"text": tokens(MAX_INPUT - 1)}, server="short"),
    gen(
        "gen-batch-one-too-long",
        {"text": ["Hi", tokens(C)], "sampling_params": {"max_new_tokens": 2}},
        "context length",
        server="short",
    ),
    gen(
        "gen-stream-past-scheduler-limit",
        {"text": tokens(MAX_INPUT), "stream": True},
        "--allow-auto-truncate",
        server="short",
    ),
    gen(
        "gen-stream-past-context",
        {"text": tokens(C), "stream": True},
        "context length",
        server="short",
    ),
    # -- /v1/completions -----------------------------------------------------------------------
    cmp("cmp-text", {"prompt": "Hi", "max_tokens": 2}),
    cmp("cmp-batch", {"prompt": ["a", "b"], "max_tokens": 2}),
    cmp("cmp-token-ids", {"prompt": [1000, 1001], "max_tokens": 2}),
    cmp("cmp-token-id-batch", {"prompt": [[1000], [1001, 1002]], "max_tokens": 2}),
    cmp("cmp-no-model", {"prompt": "Hi", "max_tokens": 2, "model": None}, "model"),
    cmp("cmp-missing-prompt", {"max_tokens": 2}, "prompt"),
    cmp("cmp-empty-prompt", {"prompt": "", "max_tokens": 2}, "Prompt cannot be empty"),
    cmp("cmp-empty-prompt-list", {"prompt": [], "max_tokens": 2}, "Prompt cannot be empty"),
    cmp("cmp-prompt-wrong-type", {"prompt": {"text": "Hi"}, "max_tokens": 2}, "prompt"),
    cmp("cmp-default-max-tokens", {"prompt": "Hi"}),
    cmp("cmp-max-tokens-zero", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    cmp("cmp-max-tokens-negative", {"prompt": "Hi", "max_tokens": -5}, "max_tokens"),
    cmp("cmp-max-tokens-null", {"prompt": "Hi", "max_tokens": None}, "max_tokens"),
    cmp("cmp-max-tokens-float", {"prompt": "Hi", "max_tokens": 2.5}, "max_tokens"),
    cmp("cmp-max-tokens-huge", {"prompt": "Hi", "max_tokens": 10**9}, "maximum context length"),
    cmp("cmp-max-tokens-huge-truncated", {"prompt": "Hi", "max_tokens": 10**9}, server="truncate"),
    cmp(
        "cmp-min-tokens-above-max",
        {"prompt": "Hi", "max_tokens": 2, "min_tokens": 3},
        "min_new_tokens",
    ),
    cmp("cmp-n3", {"prompt": "Hi", "max_tokens": 2, "n": 3}),
    cmp("cmp-logprobs", {"prompt": "Hi", "max_tokens": 2, "logprobs": 2}),
    cmp("cmp-logprobs-negative", {"prompt": "Hi", "max_tokens": 2, "logprobs": -1}),
    cmp("cmp-n-zero", {"prompt": "Hi", "max_tokens": 2, "n": 0}),
    cmp("cmp-bootstrap-room-string", {"prompt": "Hi", "max_tokens": 2, "bootstrap_room": "7"}),
    cmp("cmp-echo-logprobs", {"prompt": "Hi", "max_tokens": 2, "logprobs": 1, "echo": True}),
    cmp(
        "cmp-temperature-negative",
        {"prompt": "Hi", "max_tokens": 2, "temperature": -1},
        "temperature",
    ),
    cmp(
        "cmp-temperature-string",
        {"prompt": "Hi", "max_tokens": 2, "temperature": "hot"},
        "temperature",
    ),
    cmp("cmp-top-p-above-one", {"prompt": "Hi", "max_tokens": 2, "top_p": 1.5}, "top_p"),
    cmp("cmp-top-k-zero", {"prompt": "Hi", "max_tokens": 2, "top_k": 0}, "top_k"),
    cmp("cmp-stop", {"prompt": "Hi", "max_tokens": 2, "stop": ["\n"]}),
    cmp("cmp-stop-wrong-type", {"prompt": "Hi", "max_tokens": 2, "stop": 5}, "stop"),
    cmp("cmp-unknown-field", {"prompt": "Hi", "max_tokens": 2, "colour": "red"}),
    cmp("cmp-best-of-and-suffix", {"prompt": "Hi", "max_tokens": 2, "best_of": 2, "suffix": "!"}),
    cmp(
        "cmp-stream-usage",
        {
            "prompt": "Hi",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    cmp(
        "cmp-stream-options-without-stream",
        {"prompt": "Hi", "max_tokens": 2, "stream_options": {"include_usage": True}},
    ),
    cmp(
        "cmp-input-equals-context",
        {"prompt": tokens(C), "max_tokens": 1},
        "context length",
        server="short",
    ),
    cmp(
        "cmp-stream-past-context",
        {"prompt": tokens(C), "max_tokens": 1, "stream": True},
        "context length",
        server="short",
    ),
    cmp(
        "cmp-batch-one-over-total",
        {"prompt": ["Hi", tokens(200)], "max_tokens": 100},
        "maximum context length",
        server="short",
    ),
    # -- /v1/chat/completions ------------------------------------------------------------------
    chat("chat-basic", {"messages": HI, "max_tokens": 2}),
    chat("chat-max-completion-tokens", {"messages": HI, "max_completion_tokens": 2}),
    chat("chat-max-tokens-huge", {"messages": HI, "max_tokens": 10**9}, "maximum context length"),
    chat(
        "chat-max-tokens-above-context-length-flag",
        {"messages": HI, "max_tokens": C + 1},
        "max_completion_tokens",
        server="short",
    ),
    chat(
        "chat-max-tokens-huge-truncated", {"messages": HI, "max_tokens": 10**9}, server="truncate"
    ),
    chat("chat-max-tokens-zero", {"messages": HI, "max_tokens": 0}),
    chat("chat-max-tokens-negative", {"messages": HI, "max_tokens": -1}, "max_new_tokens"),
    chat("chat-missing-messages", {"max_tokens": 2}, "messages"),
    chat("chat-empty-messages", {"messages": [], "max_tokens": 2}, "Messages cannot be empty"),
    chat("chat-messages-not-a-list", {"messages": "Hi", "max_tokens": 2}, "messages"),
    chat("chat-message-without-role", {"messages": [{"content": "Hi"}], "max_tokens": 2}, "role"),
    chat(
        "chat-message-unknown-role",
        {"messages": [{"role": "robot", "content": "Hi"}], "max_tokens": 2},
        "role",
    ),
    chat(
        "chat-content-parts",
        {
            "messages": user([{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]),
            "max_tokens": 2,
        },
    ),
    chat(
        "chat-system-user-assistant",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Again"},
            ],
            "max_tokens": 2,
        },
    ),
    chat("chat-n2", {"messages": HI, "max_tokens": 2, "n": 2}),
    chat(
        "chat-top-logprobs-high",
        {"messages": HI, "max_tokens": 2, "logprobs": True, "top_logprobs": 50},
    ),
    chat("chat-max-completion-tokens-zero", {"messages": HI, "max_completion_tokens": 0}),
    chat(
        "chat-tool-choice-unknown-tool",
        {
            "messages": HI,
            "max_tokens": 2,
            "tools": [{"type": "function", "function": {"name": "get_time"}}],
            "tool_choice": {"type": "function", "function": {"name": "get_date"}},
        },
        "get_date",
    ),
    chat(
        "chat-routed-dp-rank-out-of-range",
        {"messages": HI, "max_tokens": 2, "routed_dp_rank": 1},
        "routed_dp_rank",
    ),
    chat(
        "chat-user-content-null",
        {"messages": [{"role": "user", "content": None}], "max_tokens": 2},
        "content",
    ),
    chat(
        "chat-assistant-content-null",
        {"messages": [*HI, {"role": "assistant", "content": None}], "max_tokens": 2},
    ),
    chat("chat-logprobs", {"messages": HI, "max_tokens": 2, "logprobs": True, "top_logprobs": 3}),
    chat(
        "chat-top-logprobs-without-logprobs", {"messages": HI, "max_tokens": 2, "top_logprobs": 3}
    ),
    chat("chat-temperature-high", {"messages": HI, "max_tokens": 2, "temperature": 3.5}),
    chat(
        "chat-temperature-negative",
        {"messages": HI, "max_tokens": 2, "temperature": -1},
        "temperature",
    ),
    chat("chat-top-p-zero", {"messages": HI, "max_tokens": 2, "top_p": 0}, "top_p"),
    chat("chat-top-k-negative", {"messages": HI, "max_tokens": 2, "top_k": -2}, "top_k"),
    chat(
        "chat-frequency-penalty-high",
        {"messages": HI, "max_tokens": 2, "frequency_penalty": 2.5},
        "frequency_penalty",
    ),
    chat(
        "chat-stop-33-strings",
        {"messages": HI, "max_tokens": 2, "stop": [f"s{i}" for i in range(33)]},
        "stop strings",
    ),
    chat("chat-seed-string", {"messages": HI, "max_tokens": 2, "seed": "abc"}, "seed"),
    chat("chat-unknown-field", {"messages": HI, "max_tokens": 2, "colour": "red"}),
    chat(
        "chat-stream-usage",
        {
            "messages": HI,
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    chat(
        "chat-tool-choice-required-without-tools",
        {"messages": HI, "max_tokens": 2, "tool_choice": "required"},
        "tool",
    ),
    chat(
        "chat-json-schema-without-schema",
        {
            "messages": HI,
            "max_tokens": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
        },
        "schema",
    ),
    chat(
        "chat-input-equals-context",
        {"messages": user(chat_tokens(C)), "max_tokens": 1},
        "context length",
        server="short",
    ),
    chat(
        "chat-stream-past-context",
        {"messages": user(chat_tokens(C)), "max_tokens": 1, "stream": True},
        "context length",
        server="short",
    ),
    chat(
        "chat-input-past-context-truncated",
        {"messages": user(chat_tokens(2 * C)), "max_tokens": 4},
        server="truncate",
    ),
    chat(
        "chat-total-one-over",
        {"messages": user(chat_tokens(100)), "max_tokens": C - 99},
        "maximum context length",
        server="short",
    ),
    chat(
        "chat-stream-past-scheduler-limit",
        {"messages": user(chat_tokens(MAX_INPUT)), "max_tokens": 1, "stream": True},
        "--allow-auto-truncate",
        server="short",
    ),
    chat(
        "chat-no-max-tokens-long-prompt",
        {"messages": user(chat_tokens(MAX_INPUT - 1))},
        server="short",
    ),
)
