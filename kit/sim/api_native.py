"""SGLang's native ``/generate`` API: request parsing and response shapes.

A body names its prompt with ``text`` (a string, or a list for a batch) or ``input_ids`` (a
list of ids, or a list of lists). ``sampling_params`` (one dict or one per prompt) carries
``max_new_tokens`` (default 128), ``min_new_tokens``, ``ignore_eos``, ``stop``,
``stop_token_ids``, ``no_stop_trim``, ``n`` and the sampling knobs SGLang validates. PD
fields (``bootstrap_host``/``bootstrap_port``/``bootstrap_room``) are scalars or, for a batch,
lists; with ``n > 1`` room R becomes R..R+n-1. A body is checked as SGLang checks it: its
JSON contract (`kit.sim.schema`), then what the tokenizer manager checks (`expand`, with the
rules of `kit.sim.admission`); the OpenAI routes build a `GenerateRequest` and take the same
second step. Responses follow SGLang: ``{"text",
"output_ids", "meta_info"}`` per sequence, a list for a batch; streams send cumulative
outputs as ``data:`` lines ending with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kit.sim import tokens
from kit.sim.admission import Limits, Sampling, check_features, check_lengths, sampling_params
from kit.sim.errors import RequestRefused, Stage
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.schema import check_generate_contract, validation_message

__all__ = ["GenerateRequest", "RequestRefused", "expand", "parse_generate"]


@dataclass
class GenerateRequest:
    """SGLang's `GenerateReqInput` (sglang/srt/managers/io_struct.py) with the fields the sim
    reads: what a /generate body holds, and what the OpenAI routes turn their bodies into.
    `text` wins over `input_ids` when both are given; a list is a batch, as in SGLang."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    top_logprobs_num: int | list[int] | None = None
    logprob_start_len: int | list[int] | None = None
    stream: bool = False
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int | None] | None = None
    routed_dp_rank: int | None = None
    lora_path: str | list[str | None] | None = None
    return_hidden_states: Any = False
    custom_logit_processor: Any = None
    priority: int | None = None
    max_thinking_tokens: int | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> GenerateRequest:
        """A /generate body that passed the contract (types are right)."""
        names = [f for f in cls.__dataclass_fields__ if f in body and body[f] is not None]
        return cls(**{name: body[name] for name in names})


def parse_generate(body: Any, limits: Limits) -> tuple[list[GenerateInput], bool, bool]:
    """The sequences a /generate body asks for, whether to answer with a list, and whether
    to stream. Raises `RequestRefused` where SGLang refuses the body, with its message."""
    if not isinstance(body, dict):
        # FastAPI's parse of the body into GenerateReqInput (a dataclass).
        error = {
            "type": "dataclass_type",
            "loc": ("body",),
            "msg": "Input should be a dictionary or an instance of GenerateReqInput",
            "input": body,
            "ctx": {"class_name": "GenerateReqInput"},
        }
        raise RequestRefused(validation_message([error]), stage=Stage.SCHEMA)
    check_generate_contract(body)
    request = GenerateRequest.from_body(body)
    inputs, batched = expand(request, limits)
    return inputs, batched, request.stream


def expand(request: GenerateRequest, limits: Limits) -> tuple[list[GenerateInput], bool]:
    """The tokenizer manager's work on a request (`generate_request`): normalize the batch
    and `n` (`GenerateReqInput.normalize_batch_and_arguments`), refuse what the server does
    not offer, tokenize, check lengths and sampling parameters. Returns one input per
    sequence (prompt-major: prompt 0's n samples first) and whether the answer is a list."""
    text, ids = request.text, request.input_ids
    prompts: list[list[int]]
    if text is not None:
        batched = not isinstance(text, str)
        texts = [text] if isinstance(text, str) else text
        prompts = [tokens.encode(t, limits.vocab) for t in texts]
    elif ids is not None:
        if not ids:
            raise RequestRefused("input_ids cannot be empty.")
        batched = not isinstance(ids[0], int)
        prompts = [list(row) for row in ids] if batched else [list(ids)]  # type: ignore[arg-type]
    else:
        raise RequestRefused("Either text, input_ids or input_embeds should be provided.")
    n = _parallel_sample_num(request.sampling_params)
    count = len(prompts)
    if batched or n > 1:
        _check_batch(request, count, n)
    check_features(
        limits,
        lora_path=request.lora_path,
        routed_dp_rank=request.routed_dp_rank,
        priority=request.priority,
        return_hidden_states=request.return_hidden_states,
        custom_logit_processor=request.custom_logit_processor,
        max_thinking_tokens=request.max_thinking_tokens,
    )

    def per_prompt(name: str) -> list[Any]:
        return _per_item(getattr(request, name), name, count, batched)

    params = per_prompt("sampling_params")
    rids = per_prompt("rid")
    logprob = per_prompt("return_logprob")
    top_k = per_prompt("top_logprobs_num")
    starts = per_prompt("logprob_start_len")
    hosts = per_prompt("bootstrap_host")
    ports = per_prompt("bootstrap_port")
    rooms = per_prompt("bootstrap_room")
    out: list[GenerateInput] = []
    for i, tokenized in enumerate(prompts):
        raw = params[i] or {}
        prompt, max_new = check_lengths(tokenized, raw.get("max_new_tokens"), limits)
        if max_new is not None:
            raw = {**raw, "max_new_tokens": max_new}
        sampling = sampling_params(raw, limits.vocab)
        base_rid = str(rids[i]) if rids[i] is not None else uuid.uuid4().hex
        room = rooms[i]
        for j in range(max(n, 1)):
            out.append(
                sequence_input(
                    base_rid if n <= 1 else f"{base_rid}-{j}",
                    prompt,
                    sampling,
                    sample_index=j,
                    stream=request.stream,
                    top_logprobs_num=int(top_k[i] or 0) if logprob[i] else None,
                    logprob_start_len=-1 if starts[i] is None else int(starts[i]),
                    bootstrap_host=hosts[i],
                    bootstrap_port=ports[i],
                    bootstrap_room=None if room is None else room + j,
                    routed_dp_rank=request.routed_dp_rank,
                )
            )
    return out, batched or len(out) > 1


def _parallel_sample_num(params: dict[str, Any] | list[dict[str, Any]] | None) -> int:
    """GenerateReqInput._handle_parallel_sampling: `n`, the same for every prompt of a
    batch; 1 for beam search."""
    if params is None:
        return 1
    first = params if isinstance(params, dict) else (params[0] if params else {})
    n = first.get("n", 1)
    if isinstance(params, list) and any(p.get("n", 1) != n for p in params):
        raise RequestRefused(
            "The parallel_sample_num should be the same for all samples in sample params."
        )
    if (first.get("beam_width") or 1) > 1:
        return 1
    return int(n or 1)


def _check_batch(request: GenerateRequest, count: int, n: int) -> None:
    """GenerateReqInput._normalize_batch_inputs' refusals."""
    if isinstance(request.rid, list):
        if len(request.rid) != count:
            raise RequestRefused(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        duplicates = sorted({r for r in request.rid if request.rid.count(r) > 1})
        if duplicates:
            raise RequestRefused(f"Duplicate request IDs detected within the request: {duplicates}")
    if n > 1:
        for name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
            if isinstance(getattr(request, name), list):
                raise RequestRefused(f"Cannot use list {name} with parallel_sample_num > 1")


def _per_item(value: Any, name: str, count: int, batched: bool) -> list[Any]:
    """One value per prompt: a batch's list as given, else the value for every prompt."""
    if batched and isinstance(value, list):
        if len(value) < count:
            # SGLang indexes past the end of the list (an IndexError, answered 500).
            raise RequestRefused(f"{name} has {len(value)} items for a batch of {count} prompts.")
        return value
    return [value] * count


def optional_index(value: Any, key: str) -> int | None:
    """`value` as a non-negative integer (a port or a rank), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestRefused(f"{key} must be a non-negative integer, got {value!r}.")
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
    `top_logprobs_num` is not None, and the PD fields."""
    if bootstrap_host is not None and not isinstance(bootstrap_host, str):
        raise RequestRefused(f"bootstrap_host must be a string, got {bootstrap_host!r}.")
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
        logprob_start_len=logprob_start_len if top_logprobs_num is not None else -1,
        sample_index=sample_index,
        bootstrap_host=bootstrap_host,
        bootstrap_port=optional_index(bootstrap_port, "bootstrap_port"),
        bootstrap_room=bootstrap_room,
        routed_dp_rank=optional_index(routed_dp_rank, "routed_dp_rank"),
    )


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
