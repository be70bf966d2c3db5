"""What SGLang 0.5.23 checks a well-formed request against before and as it schedules it.

The tokenizer manager (sglang/srt/managers/tokenizer_manager.py) refuses a request before it
reaches the scheduler, with a 400 (`RequestRefused`, stage REQUEST):

- `check_lengths` (`_validate_one_request`): an input of the context length or more; an
  explicit ``max_new_tokens`` that with the input exceeds the context. With
  ``--allow-auto-truncate`` both are cut to fit instead.
- `check_features` (`generate_request`, `_validate_and_resolve_lora`, `_validate_one_request`,
  `_set_default_priority`): features the server was not started with, a DP rank it does not
  have, a priority outside int64.
- `sampling_params` (`SamplingParams.__post_init__`, `normalize`, `verify` in
  sglang/srt/sampling/sampling_params.py): the sampling parameters' ranges.

The scheduler (sglang/srt/managers/scheduler.py, ``handle_generate_request``) then refuses an
input of ``max_req_input_len`` tokens or more and caps ``max_new_tokens`` at what the context
leaves (`Limits.admit_input`, `Limits.cap_new_tokens`): the engine applies these, and its
refusals end the request with an abort, which a stream reports inside the stream.

SGLang checks no input id against the vocabulary: `embedding_crash` says what an id outside it
does to a prefill or a plain server (the embedding's IndexError kills the scheduler and the whole
server); the engine's `on_fatal` does the dying.

Messages are SGLang's, word for word.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kit.sim.errors import RequestRefused

DEFAULT_MAX_NEW_TOKENS = 128  # SamplingParams.max_new_tokens
TOP_K_ALL = 1 << 30  # sampling_params.TOP_K_ALL: the whole vocabulary
SAMPLING_EPS = 1e-6
MAX_STOP_COUNT = 32
MAX_STOP_REGEX_COUNT = 32
MAX_STOP_REGEX_LEN = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UNLIMITED_NEW_TOKENS = 1 << 30  # scheduler.init_req_max_new_tokens: None means this
# tp_worker.py: max_req_input_len = max_req_len - 5.
MAX_REQ_INPUT_MARGIN = 5


@dataclass(frozen=True)
class Limits:
    """One worker's limits, in tokens, and the request-shaping flags it was started with."""

    context_len: int
    vocab: int
    kv_capacity: int
    allow_auto_truncate: bool = False
    # --context-length as given: the chat route checks max_tokens against it when set.
    context_length_flag: int | None = None
    dp_size: int = 1
    enable_custom_logit_processor: bool = False

    @property
    def max_req_len(self) -> int:
        """tp_worker.py: the longest sequence (input and output) the scheduler takes."""
        return min(self.context_len - 1, self.kv_capacity - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - MAX_REQ_INPUT_MARGIN

    def admit_input(self, prompt_len: int) -> tuple[int, str | None]:
        """The scheduler's `validate_input_length` (managers/utils.py): the input length to
        keep, or a refusal."""
        limit = self.max_req_input_len
        if prompt_len < limit:
            return prompt_len, None
        if self.allow_auto_truncate:
            return limit, None
        return prompt_len, (
            f"Input length ({prompt_len} tokens) exceeds the maximum allowed length "
            f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate."
        )

    def cap_new_tokens(self, max_new_tokens: int | None, prompt_len: int) -> int:
        """scheduler.init_req_max_new_tokens: what the context leaves after the input."""
        wanted = UNLIMITED_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        return max(0, min(wanted, self.max_req_len - prompt_len - 1))


def check_lengths(
    prompt: list[int], max_new_tokens: int | None, limits: Limits
) -> tuple[list[int], int | None]:
    """TokenizerManager._validate_one_request: the prompt and the explicit max_new_tokens
    (None: not given), cut to fit with --allow-auto-truncate, else refused."""
    context = limits.context_len
    input_tokens = len(prompt)
    if input_tokens >= context:
        if not limits.allow_auto_truncate:
            raise RequestRefused(
                f"The input ({input_tokens} tokens) is longer than the model's context "
                f"length ({context} tokens)."
            )
        prompt = prompt[:context]
        input_tokens = len(prompt)
    if max_new_tokens is not None and max_new_tokens + input_tokens > context:
        if not limits.allow_auto_truncate:
            raise RequestRefused(
                "Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {max_new_tokens + input_tokens} "
                f"tokens: {input_tokens} tokens from the input messages and {max_new_tokens} "
                "tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )
        max_new_tokens = max(0, context - input_tokens)
    return prompt, max_new_tokens


def embedding_crash(prompt: Sequence[int], vocab: int) -> str | None:
    """torch.embedding's words when a prompt id is outside the vocabulary, else None."""
    if any(not 0 <= t < vocab for t in prompt):
        return "IndexError: index out of range in self"
    return None


def check_features(
    limits: Limits,
    *,
    lora_path: Any = None,
    routed_dp_rank: int | None = None,
    priority: int | None = None,
    return_hidden_states: Any = False,
    custom_logit_processor: Any = None,
    max_thinking_tokens: int | None = None,
) -> None:
    """The tokenizer manager's request checks that do not depend on the prompt."""
    if priority is not None and not INT64_MIN <= priority <= INT64_MAX:
        raise RequestRefused(
            "priority must be a signed 64-bit integer between -9223372036854775808 and "
            "9223372036854775807"
        )
    if max_thinking_tokens is not None:
        raise RequestRefused(
            "max_thinking_tokens requires the server to be launched with --enable-strict-thinking"
        )
    ignored_rank = limits.dp_size <= 1 and routed_dp_rank == 0
    if routed_dp_rank is not None and not ignored_rank and not 0 <= routed_dp_rank < limits.dp_size:
        raise RequestRefused(f"routed_dp_rank={routed_dp_rank} out of range [0, {limits.dp_size})")
    if lora_path:
        adapters = [lora_path] if isinstance(lora_path, str) else lora_path
        first = next((a for a in adapters if a), None)
        raise RequestRefused(
            f"LoRA adapter '{first}' was requested, but LoRA is not enabled. Please launch the "
            "server with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint."
        )
    hidden = (
        return_hidden_states if isinstance(return_hidden_states, list) else [return_hidden_states]
    )
    if any(mode not in (False, None) for mode in hidden):
        raise RequestRefused(
            "The server is not configured to return hidden states. Please set "
            "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the "
            "legacy `--enable-return-hidden-states` flag."
        )
    if custom_logit_processor and not limits.enable_custom_logit_processor:
        raise RequestRefused(
            "The server is not configured to enable custom logit processor. Please set "
            "`--enable-custom-logit-processor` to enable this feature."
        )


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters the sim acts on (the rest are only validated)."""

    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    no_stop_trim: bool = False
    n: int = 1


def _or(params: Mapping[str, Any], key: str, default: Any) -> Any:
    """SamplingParams.__post_init__: a missing or null parameter takes its default."""
    value = params.get(key)
    return default if value is None else value


def sampling_params(params: Mapping[str, Any], vocab: int) -> Sampling:
    """`SamplingParams(**params)`, `.normalize()` and `.verify(vocab)`: the parameters, or an
    `RequestRefused` with SGLang's message. Types are checked before (the contract, pydantic)."""
    temperature = _or(params, "temperature", 1.0)
    top_k = _or(params, "top_k", -1)
    if 0 <= temperature < SAMPLING_EPS:
        temperature, top_k = 1.0, 1  # greedy
    if top_k == -1:
        top_k = TOP_K_ALL
    top_p = _or(params, "top_p", 1.0)
    min_p = _or(params, "min_p", 0.0)
    frequency_penalty = _or(params, "frequency_penalty", 0.0)
    presence_penalty = _or(params, "presence_penalty", 0.0)
    repetition_penalty = _or(params, "repetition_penalty", 1.0)
    min_new = _or(params, "min_new_tokens", 0)
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    beam_width = params.get("beam_width")
    # verify()
    if beam_width is not None and beam_width < 1:
        raise RequestRefused(f"beam_width must be at least 1, got {beam_width}.")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise RequestRefused(
            f"temperature must be a non-negative finite number, got {temperature}."
        )
    if not 0.0 < top_p <= 1.0:
        raise RequestRefused(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise RequestRefused(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1:
        raise RequestRefused(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if not -2.0 <= frequency_penalty <= 2.0:
        raise RequestRefused(f"frequency_penalty must be in [-2, 2], got {frequency_penalty}.")
    if not -2.0 <= presence_penalty <= 2.0:
        raise RequestRefused(f"presence_penalty must be in [-2, 2], got {presence_penalty}.")
    if not 0.0 < repetition_penalty <= 2.0:
        raise RequestRefused(
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition_penalty}."
        )
    if min_new < 0:
        raise RequestRefused(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    if max_new is not None:
        if max_new < 0:
            raise RequestRefused(f"max_new_tokens must be at least 0, got {max_new}.")
        if not min_new <= max_new:
            raise RequestRefused(
                f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."
            )
    for token_id in params.get("logit_bias") or {}:
        if not _is_token(token_id, vocab):
            raise RequestRefused(f"logit_bias must has keys in [0, {vocab - 1}], got {token_id}.")
    seed = params.get("sampling_seed")
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        raise RequestRefused(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")
    grammars = [params.get(k) for k in ("json_schema", "regex", "ebnf", "structural_tag")]
    if sum(bool(g) for g in grammars) > 1:
        raise RequestRefused("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    # normalize()
    stop = _strings(params.get("stop"))
    if len(stop) > MAX_STOP_COUNT:
        raise RequestRefused(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stop)}")
    stop_regex = _strings(params.get("stop_regex"))
    if len(stop_regex) > MAX_STOP_REGEX_COUNT:
        raise RequestRefused(
            f"at most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed, got {len(stop_regex)}"
        )
    for pattern in stop_regex:
        size = len(pattern.encode("utf-8"))
        if size > MAX_STOP_REGEX_LEN:
            raise RequestRefused(
                f"stop_regex is {size} bytes, over the {MAX_STOP_REGEX_LEN}-byte limit"
            )
    return Sampling(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        ignore_eos=bool(_or(params, "ignore_eos", False)),
        stop=stop,
        stop_token_ids=tuple(int(t) for t in params.get("stop_token_ids") or () if t is not None),
        no_stop_trim=bool(_or(params, "no_stop_trim", False)),
        n=_or(params, "n", 1),
    )


def _strings(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _is_token(key: str, vocab: int) -> bool:
    try:
        return 0 <= int(key) < vocab
    except ValueError:
        return False
