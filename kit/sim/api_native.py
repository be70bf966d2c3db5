"""SGLang's native ``/generate`` API: request parsing and response shapes.

A body names its prompt with ``text`` (a string, or a list for a batch) or ``input_ids`` (a
list of ids, or a list of lists). ``sampling_params`` (one dict or one per prompt) carries
``max_new_tokens`` (default 128), ``min_new_tokens``, ``ignore_eos``, ``stop``,
``stop_token_ids``, ``no_stop_trim``, ``n`` and the sampling knobs SGLang validates. PD
fields (``bootstrap_host``/``bootstrap_port``/``bootstrap_room``) are scalars or, for a batch,
lists; with ``n > 1`` room R becomes R..R+n-1. Responses follow SGLang: ``{"text",
"output_ids", "meta_info"}`` per sequence, a list for a batch; streams send cumulative
outputs as ``data:`` lines ending with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from kit.sim import tokens
from kit.sim.requests import GenerateInput, RequestState

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang SamplingParams default


class ApiError(ValueError):
    """A request SGLang would refuse; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters the sim acts on (the rest are only validated)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    no_stop_trim: bool = False
    n: int = 1


def _number(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(f"{key} must be a number, got {value!r}.")
    return float(value)


def _int(params: dict[str, Any], key: str, default: int) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key} must be an integer, got {value!r}.")
    return value


def parse_sampling(params: Any) -> Sampling:
    """Validate like SGLang's ``SamplingParams.verify`` and keep what the sim uses."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ApiError(f"sampling_params must be an object, got {type(params).__name__}.")
    temperature = _number(params, "temperature", 1.0)
    if temperature < 0 or not math.isfinite(temperature):
        raise ApiError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = _number(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(f"top_p must be in (0, 1], got {top_p}.")
    top_k = _int(params, "top_k", -1)
    if top_k < 1 and top_k != -1:
        raise ApiError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for key in ("frequency_penalty", "presence_penalty"):
        value = _number(params, key, 0.0)
        if not -2 <= value <= 2:
            raise ApiError(f"{key} must be in [-2, 2], got {value}.")
    max_new = _int(params, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new < 0:
        raise ApiError(f"max_new_tokens must be at least 0, got {max_new}.")
    min_new = _int(params, "min_new_tokens", 0)
    if not 0 <= min_new <= max_new:
        raise ApiError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")
    n = _int(params, "n", 1)
    if n < 1:
        raise ApiError(f"n must be at least 1, got {n}.")
    stop = params.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise ApiError("stop must be a string or a list of strings.")
    stop_ids = params.get("stop_token_ids") or ()
    if not isinstance(stop_ids, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop_ids
    ):
        raise ApiError("stop_token_ids must be a list of integers.")
    return Sampling(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        ignore_eos=bool(params.get("ignore_eos", False)),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
        no_stop_trim=bool(params.get("no_stop_trim", False)),
        n=n,
    )


def _per_item(value: Any, count: int, key: str, batched: bool) -> list[Any]:
    if batched and isinstance(value, list):
        if len(value) != count:
            raise ApiError(f"{key} has {len(value)} items for a batch of {count}.")
        return value
    return [value] * count


def optional_index(value: Any, key: str) -> int | None:
    """`value` as a non-negative integer (a room, port or rank), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(f"{key} must be a non-negative integer, got {value!r}.")
    return value


def sequence_input(
    rid: str,
    prompt: list[int],
    sampling: Sampling,
    *,
    sample_index: int,
    stream: bool,
    top_logprobs_num: int | None,
    logprob_start_len: int,
    bootstrap_host: Any,
    bootstrap_port: Any,
    bootstrap_room: int | None,
    routed_dp_rank: Any,
) -> GenerateInput:
    """One sequence of a request (native or OpenAI): `sampling`'s fields, logprobs when
    `top_logprobs_num` is not None, and the PD fields checked as SGLang types them."""
    if bootstrap_host is not None and not isinstance(bootstrap_host, str):
        raise ApiError(f"bootstrap_host must be a string, got {bootstrap_host!r}.")
    return GenerateInput(
        rid=rid,
        prompt_ids=prompt,
        max_new_tokens=sampling.max_new_tokens,
        min_new_tokens=sampling.min_new_tokens,
        ignore_eos=sampling.ignore_eos,
        stop=list(sampling.stop),
        stop_token_ids=list(sampling.stop_token_ids),
        no_stop_trim=sampling.no_stop_trim,
        stream=stream,
        return_logprob=top_logprobs_num is not None,
        top_logprobs_num=top_logprobs_num or 0,
        logprob_start_len=logprob_start_len,
        sample_index=sample_index,
        bootstrap_host=bootstrap_host,
        bootstrap_port=optional_index(bootstrap_port, "bootstrap_port"),
        bootstrap_room=bootstrap_room,
        routed_dp_rank=optional_index(routed_dp_rank, "routed_dp_rank"),
    )


def parse_prompts(body: dict[str, Any], vocab: int) -> tuple[list[list[int]], bool]:
    """Prompt token ids per prompt, and whether the body is a batch."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        raise ApiError("Either text, input_ids or input_embeds should be provided.")
    if text is not None and ids is not None:
        raise ApiError("Either text or input_ids should be provided, not both.")
    if text is not None:
        if isinstance(text, str):
            return [tokens.encode(text, vocab)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [tokens.encode(t, vocab) for t in text], True
        raise ApiError("text must be a string or a non-empty list of strings.")
    if (
        isinstance(ids, list)
        and ids
        and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        return [list(ids)], False
    if (
        isinstance(ids, list)
        and ids
        and all(
            isinstance(row, list) and row and all(isinstance(i, int) for i in row) for row in ids
        )
    ):
        return [list(row) for row in ids], True
    raise ApiError("input_ids must be a non-empty list of token ids or of such lists.")


def _start(value: Any, prompt_len: int) -> int:
    """logprob_start_len as SGLang takes it: None/-1 = no prompt logprobs."""
    if value is None:
        return -1
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise ApiError("logprob_start_len must be an integer >= -1.")
    if value > prompt_len:
        raise ApiError(
            f"logprob_start_len={value} is higher than the number of input tokens "
            f"{prompt_len}. Please use a smaller logprob_start_len."
        )
    return value


def parse_generate(body: Any, vocab: int) -> tuple[list[GenerateInput], bool, bool]:
    """The sequences a /generate body asks for, whether to answer with a list, and whether
    to stream. Raises `ApiError` with SGLang's messages."""
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.")
    prompts, batched = parse_prompts(body, vocab)
    count = len(prompts)
    params = _per_item(body.get("sampling_params"), count, "sampling_params", batched)
    rids = _per_item(body.get("rid"), count, "rid", batched)
    logprob = _per_item(body.get("return_logprob", False), count, "return_logprob", batched)
    top_k = _per_item(body.get("top_logprobs_num", 0), count, "top_logprobs_num", batched)
    starts = _per_item(body.get("logprob_start_len"), count, "logprob_start_len", batched)
    hosts = _per_item(body.get("bootstrap_host"), count, "bootstrap_host", batched)
    ports = _per_item(body.get("bootstrap_port"), count, "bootstrap_port", batched)
    rooms = _per_item(body.get("bootstrap_room"), count, "bootstrap_room", batched)
    dp_ranks = _per_item(body.get("routed_dp_rank"), count, "routed_dp_rank", batched)
    stream = bool(body.get("stream", False))
    out: list[GenerateInput] = []
    for i, prompt in enumerate(prompts):
        sampling = parse_sampling(params[i])
        base_rid = str(rids[i]) if rids[i] is not None else uuid.uuid4().hex
        room = optional_index(rooms[i], "bootstrap_room")
        for j in range(sampling.n):
            out.append(
                sequence_input(
                    base_rid if sampling.n == 1 else f"{base_rid}-{j}",
                    prompt,
                    sampling,
                    sample_index=j,
                    stream=stream,
                    top_logprobs_num=int(top_k[i] or 0) if logprob[i] else None,
                    logprob_start_len=_start(starts[i], len(prompt)) if logprob[i] else -1,
                    bootstrap_host=hosts[i],
                    bootstrap_port=ports[i],
                    bootstrap_room=None if room is None else room + j,
                    routed_dp_rank=dp_ranks[i],
                )
            )
    return out, batched or len(out) > 1, stream


def output(state: RequestState) -> dict[str, Any]:
    """One sequence's output so far, SGLang's shape (cumulative)."""
    return {
        "text": state.text,
        "output_ids": list(state.output_ids),
        "meta_info": state.meta_info(),
    }


def output_json(state: RequestState, index: int | None = None) -> str:
    """`output` serialized; the growing id list is kept pre-serialized by the state, so a
    stream chunk costs O(new tokens) in encoding rather than a full re-encode."""
    index_part = "" if index is None else f',"index":{index}'
    return (
        f'{{"text":{json.dumps(state.text)},"output_ids":[{state.ids_csv}],'
        f'"meta_info":{json.dumps(state.meta_info(), separators=(",", ":"))}{index_part}}}'
    )


def error_of(state: RequestState) -> tuple[int, str] | None:
    """(status, message) when the sequence ended in an error SGLang reports as one."""
    reason = state.finish
    if reason is None or reason.kind != "abort":
        return None
    return reason.status_code or 500, reason.message or "Aborted"
