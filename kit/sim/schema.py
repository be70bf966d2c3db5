"""The shapes SGLang 0.5.23 requires of a request body, before it looks at what the body means.

SGLang parses an OpenAI body into its pydantic models (`sglang/srt/entrypoints/openai/
protocol.py`: `CompletionRequest`, `ChatCompletionRequest`) and answers a failure with a 400
whose message is FastAPI's validation error (`http_server.py`, `validation_exception_handler`).
`CompletionRequest` and `ChatCompletionRequest` here are those models with the fields the sim
acts on or that clients commonly send, with SGLang's types and validators, so that the same
bodies pass and fail (pydantic's lax mode, as SGLang's: ``"8"`` is an int); fields SGLang has
and these do not are accepted and ignored.

A ``/generate`` body goes through SGLang's JSON contract (`sglang/api/v1/api_types.py`,
`GenerateRequest.from_json_value`): strict JSON types, unknown top-level keys ignored, unknown
`sampling_params` keys refused. `check_generate_contract` runs the same decoding with the same
serde-style messages, led by the field's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from kit.sim.errors import RequestRefused, Stage

DEFAULT_MODEL_NAME = "default"  # protocol.py DEFAULT_MODEL_NAME
# protocol.py _GenericMessageRole: every role but "user", which has its own message type.
GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
MEDIA_PART_TYPES = (
    "image_url",
    "video_url",
    "audio_url",
    "input_audio",
    "thinking",
    "reasoning",
    "tool_reference",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _migrate_deprecated_dp_rank(values: Any) -> Any:
    """protocol.py: data_parallel_rank is the old name of routed_dp_rank."""
    if isinstance(values, dict) and values.get("data_parallel_rank") is not None:
        values = dict(values)
        if values.get("routed_dp_rank") is None:
            values["routed_dp_rank"] = values["data_parallel_rank"]
    return values


class PDRoutingFields(_Model):
    bootstrap_host: list[str] | str | None = None
    bootstrap_port: list[int | None] | int | None = None
    bootstrap_room: list[int] | int | None = None
    routed_dp_rank: int | None = None
    disagg_prefill_dp_rank: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _handle_deprecated_dp_rank(cls, values: Any) -> Any:
        return _migrate_deprecated_dp_rank(values)


class StreamOptions(_Model):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class JsonSchemaResponseFormat(_Model):
    name: str
    description: str | None = None
    schema_: dict[str, object] | None = Field(alias="schema", default=None)
    strict: StrictBool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


class StructuralTagResponseFormat(_Model):
    model_config = ConfigDict(extra="allow")
    type: Literal["structural_tag"]


class _SamplingFields(PDRoutingFields):
    """What CompletionRequest and ChatCompletionRequest share."""

    model: str = DEFAULT_MODEL_NAME
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    min_tokens: int = 0
    regex: str | None = None
    ebnf: str | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    return_hidden_states: bool | Literal["last"] = False
    lora_path: list[str | None] | str | None = None
    session_id: str | None = None
    custom_params: dict[str, Any] | None = None
    rid: list[str] | str | None = None
    priority: int | None = None
    response_format: ResponseFormat | StructuralTagResponseFormat | None = None


class CompletionRequest(_SamplingFields):
    """protocol.py CompletionRequest (the fields listed)."""

    prompt: list[int] | list[list[int]] | str | list[str]
    return_token_ids: bool = False
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int = 16
    suffix: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: str | None = None
    custom_logit_processor: str | None = None

    @field_validator("max_tokens")
    @classmethod
    def validate_max_tokens_positive(cls, v: int) -> int:
        if v is not None and v <= 0:
            raise ValueError("max_tokens must be positive")
        return v


class TextPart(_Model):
    type: Literal["text"]
    text: str


class MediaPart(_Model):
    """An image, audio, video, thinking or tool-reference part: the sim renders text only."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "image_url",
        "video_url",
        "audio_url",
        "input_audio",
        "thinking",
        "reasoning",
        "tool_reference",
    ]


ContentPart = TextPart | MediaPart


class ChatCompletionMessageGenericParam(_Model):
    """protocol.py ChatCompletionMessageGenericParam: any role but user."""

    role: Literal["system", "assistant", "tool", "function", "developer", "latest_reminder", "root"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _normalize_role(cls, v: Any) -> Any:
        if isinstance(v, str):
            v_lower = v.lower()
            if v_lower not in GENERIC_ROLES:
                allowed = ", ".join(repr(r) for r in GENERIC_ROLES)
                raise ValueError(f"'role' must be one of {allowed} (case-insensitive).")
            return v_lower
        raise ValueError("'role' must be a string")


class ChatCompletionMessageUserParam(_Model):
    """protocol.py ChatCompletionMessageUserParam."""

    role: Literal["user"]
    content: str | list[ContentPart]


Message = ChatCompletionMessageGenericParam | ChatCompletionMessageUserParam


class Function(_Model):
    name: str
    description: str | None = None
    parameters: object | None = None
    strict: bool | None = None


class Tool(_Model):
    type: str = "function"
    function: Function


class ToolChoiceFuncName(_Model):
    name: str


class ToolChoice(_Model):
    function: ToolChoiceFuncName
    type: Literal["function"] = "function"


class ChatCompletionRequest(_SamplingFields):
    """protocol.py ChatCompletionRequest (the fields listed)."""

    messages: list[Message]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | Literal["auto", "required", "none"] = "auto"
    parallel_tool_calls: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    custom_logit_processor: list[str | None] | str | None = None
    input_ids: list[int] | None = None

    @model_validator(mode="before")
    @classmethod
    def set_tool_choice_default(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("tool_choice") is None:
            values = dict(values)
            values["tool_choice"] = "none" if values.get("tools") is None else "auto"
        return values


M = TypeVar("M", bound=BaseModel)


def parse_openai(model: type[M], body: Any) -> M:
    """`body` as `model`, or a `RequestRefused` with FastAPI's validation message (SGLang sends
    ``f"{exc} {exc.errors()}"`` as the ErrorResponse's message, with type "Bad Request")."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestRefused(validation_message(errors), stage=Stage.SCHEMA) from exc


def validation_message(errors: list[dict[str, Any]]) -> str:
    """FastAPI's RequestValidationError text followed by its errors, as SGLang sends it."""
    count = len(errors)
    head = f"{count} validation error{'s' if count != 1 else ''}:\n"
    listed = "".join(f"  {error}\n" for error in errors)
    return f"{head}{listed}".rstrip() + f" {errors}"


# -- /generate: SGLang's JSON contract (sglang/api/v1/api_types.py) -----------------------------


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display (api_types._unexpected)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


class ContractError(Exception):
    """One contract violation; `field` is filled in on the way up."""


def _invalid(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")


def _int(v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise _invalid(v, "i64")


def _float(v: Any) -> None:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _invalid(v, "f64")


def _bool(v: Any) -> None:
    if not isinstance(v, bool):
        raise _invalid(v, "a boolean")


def _str(v: Any) -> None:
    if not isinstance(v, str):
        raise _invalid(v, "a string")


def _seq(v: Any, each: Callable[[Any], None]) -> None:
    if not isinstance(v, list):
        raise _invalid(v, "a sequence")
    for e in v:
        each(e)


def _or_list(name: str, each: Callable[[Any], None]) -> Callable[[Any], None]:
    """`<T>OrList`: one value, or an array of them."""

    def check(v: Any) -> None:
        if isinstance(v, list):
            _seq(v, each)
            return
        try:
            each(v)
        except ContractError:
            raise _invalid(v, f"a value or an array of values for {name}") from None

    return check


def _optional(each: Callable[[Any], None]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if v is not None:
            each(v)

    return check


def _token_ids(v: Any) -> None:
    """TokenIdsOrList: [] and [number, ...] are one prompt, anything else a batch."""
    if not isinstance(v, list):
        raise _invalid(v, "a value or an array of values for TokenIdsOrList")
    if not v or (isinstance(v[0], int | float) and not isinstance(v[0], bool)):
        _seq(v, _int)
    else:
        _seq(v, lambda row: _seq(row, _int))


def _map(v: Any, each: Callable[[Any], None]) -> None:
    if not isinstance(v, dict):
        raise _invalid(v, "a map")
    for e in v.values():
        each(e)


def _any(v: Any) -> None:
    pass


_STRING_OR_LIST = _or_list("StringOrList", _str)
# api_types.SamplingParams, in its order (the order of the unknown-field message).
SAMPLING_FIELDS: dict[str, Callable[[Any], None]] = {
    "max_new_tokens": _int,
    "stop": _STRING_OR_LIST,
    "stop_token_ids": lambda v: _seq(v, _int),
    "stop_regex": _STRING_OR_LIST,
    "temperature": _float,
    "top_p": _float,
    "top_k": _int,
    "min_p": _float,
    "frequency_penalty": _float,
    "presence_penalty": _float,
    "repetition_penalty": _float,
    "min_new_tokens": _int,
    "n": _int,
    "json_schema": _str,
    "regex": _str,
    "ebnf": _str,
    "structural_tag": _str,
    "ignore_eos": _bool,
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "no_stop_trim": _bool,
    "stream_interval": _int,
    "logit_bias": lambda v: _map(v, _float),
    "sampling_seed": _int,
    "custom_params": _any,
    "beam_width": _int,
    "watermark": _any,
    "choice": lambda v: _seq(v, _str),
}


def _sampling_params(v: Any) -> None:
    if not isinstance(v, dict):
        raise _invalid(v, "struct SamplingParams")
    for key, x in v.items():
        check = SAMPLING_FIELDS.get(key)
        if check is None:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
        if x is not None:
            check(x)


def _sampling_params_or_list(v: Any) -> None:
    if isinstance(v, list):
        _seq(v, _sampling_params)
    elif isinstance(v, dict):
        _sampling_params(v)
    else:
        raise _invalid(v, "a value or an array of values for SamplingParamsOrList")


# api_types.GenerateRequest: the fields the sim reads or clients commonly send; the others
# are ignored, as unknown ones are.
GENERATE_FIELDS: dict[str, Callable[[Any], None]] = {
    "rid": _STRING_OR_LIST,
    "text": _STRING_OR_LIST,
    "input_ids": _token_ids,
    "stream": _bool,
    "sampling_params": _sampling_params_or_list,
    "return_logprob": _or_list("BoolOrList", _bool),
    "logprob_start_len": _or_list("Int64OrList", _int),
    "top_logprobs_num": _or_list("Int64OrList", _int),
    "token_ids_logprob": _token_ids,
    "return_hidden_states": _or_list("BoolOrList", _bool),
    "return_text_in_logprobs": _bool,
    "bootstrap_host": _or_list("OptionalStringOrList", _optional(_str)),
    "bootstrap_port": _or_list("OptionalInt64OrList", _optional(_int)),
    "bootstrap_room": _or_list("OptionalInt64OrList", _optional(_int)),
    "bootstrap_pair_key": _or_list("OptionalStringOrList", _optional(_str)),
    "decode_tp_size": _or_list("OptionalInt64OrList", _optional(_int)),
    "routed_dp_rank": _int,
    "disagg_prefill_dp_rank": _int,
    "extra_key": _STRING_OR_LIST,
    "priority": _int,
    "cache_salt": _STRING_OR_LIST,
    "require_reasoning": _bool,
    "lora_path": _or_list("OptionalStringOrList", _optional(_str)),
    "routing_key": _str,
    "max_thinking_tokens": _int,
    "session_id": _str,
    "custom_logit_processor": _or_list("OptionalStringOrList", _optional(_str)),
    "custom_labels": lambda v: _map(v, _str),
    "return_prompt_token_ids": _bool,
    "routed_experts_start_len": _int,
    "return_sampling_mask": _or_list("BoolOrList", _bool),
}


def check_generate_contract(body: Any) -> None:
    """Raise `RequestRefused` (400, SGLang's ``{"error": "<text>"}`` body) for the first contract
    violation of a /generate body, as `generate_contract_error` finds it."""
    if not isinstance(body, dict):
        raise RequestRefused(
            f"invalid type: {_unexpected(body)}, expected struct GenerateRequest",
            stage=Stage.CONTRACT,
        )
    for key, value in body.items():
        check = GENERATE_FIELDS.get(key)
        if check is None or value is None:
            continue
        try:
            check(value)
        except ContractError as exc:
            raise RequestRefused(f"{key}: {exc}", stage=Stage.CONTRACT) from None
