"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``, in SGLang's shapes.

Chat prompts are rendered by `tokens.render_chat` and counted by the one token rule. Streams
send a first chunk with the assistant role (chat), content deltas, a chunk with the
``finish_reason``, a usage chunk when ``stream_options.include_usage`` is set, and
``data: [DONE]``; an error after the stream started is a ``data: {"error": ...}`` line, as
SGLang sends it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kit.sim import tokens
from kit.sim.admission import Limits
from kit.sim.api_native import GenerateRequest, expand
from kit.sim.errors import RequestRefused
from kit.sim.requests import GenerateInput, RequestState
from kit.sim.schema import ChatCompletionRequest, CompletionRequest, parse_openai


def parse_completion(body: Any, limits: Limits) -> list[GenerateInput]:
    """Sequences for a /v1/completions body, as SGLang's OpenAIServingCompletion builds its
    GenerateReqInput (serving_completions.py: `_validate_request`,
    `_convert_to_internal_request`, `_build_sampling_params`)."""
    request = parse_openai(CompletionRequest, body)
    prompt = request.prompt
    if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
        raise RequestRefused("Prompt cannot be empty")
    _check_response_format(request.response_format)
    params = {
        "temperature": request.temperature,
        "max_new_tokens": request.max_tokens,
        "min_new_tokens": request.min_tokens,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "stop_regex": request.stop_regex,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty,
        "regex": request.regex,
        "json_schema": request.json_schema,
        "ebnf": request.ebnf,
        "n": request.n,
        "no_stop_trim": request.no_stop_trim,
        "ignore_eos": request.ignore_eos,
        "logit_bias": request.logit_bias,
        "sampling_seed": request.seed,
    }
    as_text = isinstance(prompt, str) or isinstance(prompt[0], str)
    generate = GenerateRequest(
        text=prompt if as_text else None,  # type: ignore[arg-type]
        input_ids=None if as_text else prompt,  # type: ignore[arg-type]
        sampling_params=params,
        return_logprob=request.logprobs is not None,
        top_logprobs_num=request.logprobs if request.logprobs is not None else 0,
        # serving_completions: prompt logprobs only for echo with logprobs
        logprob_start_len=0 if request.echo and request.logprobs else -1,
        **_common(request),
    )
    return expand(generate, limits)[0]


def parse_chat(body: Any, limits: Limits) -> list[GenerateInput]:
    """Sequences for a /v1/chat/completions body, as SGLang's OpenAIServingChat builds its
    GenerateReqInput (serving_chat.py: `_validate_request`, `_convert_to_internal_request`,
    `ChatCompletionRequest.to_sampling_params`). The prompt is the sim's rendering of the
    messages (`tokens.render_chat`); without ``max_tokens`` the answer may run to the context
    (the emulated EOS usually ends it first)."""
    request = parse_openai(ChatCompletionRequest, body)
    _validate_chat(request, limits)
    if request.input_ids is not None:
        prompt = list(request.input_ids)
    else:
        messages = [m.model_dump() for m in request.messages]
        prompt = tokens.encode(tokens.render_chat(messages), limits.vocab)
    stop = request.stop or []
    params = {
        "temperature": 1.0 if request.temperature is None else request.temperature,
        # SGLang's `max_completion_tokens or max_tokens`: a max_completion_tokens of 0 counts
        # as not given.
        "max_new_tokens": request.max_completion_tokens or request.max_tokens,
        "min_new_tokens": request.min_tokens,
        "stop": [stop] if isinstance(stop, str) else list(stop),
        "stop_token_ids": request.stop_token_ids,
        "stop_regex": request.stop_regex,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": -1 if request.top_k is None else request.top_k,
        "min_p": 0.0 if request.min_p is None else request.min_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": (
            1.0 if request.repetition_penalty is None else request.repetition_penalty
        ),
        "regex": request.regex,
        "ebnf": request.ebnf,
        "n": request.n,
        "no_stop_trim": request.no_stop_trim,
        "ignore_eos": request.ignore_eos,
        "logit_bias": request.logit_bias,
        "sampling_seed": request.seed,
    }
    generate = GenerateRequest(
        input_ids=prompt,
        sampling_params=params,
        return_logprob=request.logprobs,
        top_logprobs_num=request.top_logprobs or 0,
        logprob_start_len=-1,
        **_common(request),
    )
    return expand(generate, limits)[0]


def _common(request: CompletionRequest | ChatCompletionRequest) -> dict[str, Any]:
    """The GenerateReqInput fields both OpenAI routes pass through as they are."""
    return {
        "stream": request.stream,
        "bootstrap_host": request.bootstrap_host,
        "bootstrap_port": request.bootstrap_port,
        "bootstrap_room": request.bootstrap_room,
        "routed_dp_rank": request.routed_dp_rank,
        "lora_path": request.lora_path,
        "return_hidden_states": request.return_hidden_states,
        "custom_logit_processor": request.custom_logit_processor,
        "rid": request.rid,
        "priority": request.priority,
    }


def _check_response_format(response_format: Any) -> None:
    if getattr(response_format, "type", None) != "json_schema":
        return
    if getattr(response_format.json_schema, "schema_", None) is None:
        raise RequestRefused("schema_ is required for json_schema response format request.")


def _validate_chat(request: ChatCompletionRequest, limits: Limits) -> None:
    """OpenAIServingChat._validate_request, for a text-only model without tool parsers."""
    if not request.messages:
        raise RequestRefused("Messages cannot be empty.")
    if request.chat_template_kwargs and "chat_template" in request.chat_template_kwargs:
        raise RequestRefused(
            "Request-supplied chat_template is not allowed. Start the server with "
            "--trust-request-chat-template to permit it."
        )
    tools = request.tools or []
    choice = request.tool_choice
    if isinstance(choice, str) and choice.lower() == "required" and not tools:
        raise RequestRefused("Tools cannot be empty if tool choice is set to required.")
    if not isinstance(choice, str):
        if not tools:
            raise RequestRefused("Tools cannot be empty if tool choice is set to a specific tool.")
        if not any(tool.function.name == choice.function.name for tool in tools):
            raise RequestRefused(f"Tool '{choice.function.name}' not found in tools list.")
    max_output = request.max_completion_tokens or request.max_tokens
    flag = limits.context_length_flag
    if max_output and flag and max_output > flag and not limits.allow_auto_truncate:
        raise RequestRefused(
            f"max_completion_tokens is too large: {max_output}."
            f"This model supports at most {flag} completion tokens."
        )
    _check_response_format(request.response_format)


@dataclass(frozen=True)
class Echo:
    """Per sequence: the echoed prompt text; whether the prompt logprobs are echoed too."""

    texts: list[str]
    logprobs: bool


def completion_echo(body: dict[str, Any], n: int) -> Echo | None:
    """What ``echo: true`` puts in front of each sequence of a /v1/completions answer (`n`
    sequences a prompt), as SGLang's serving_completions does: the prompt text (token-id
    prompts decoded), and, when ``logprobs`` is positive, the prompt logprobs. A PD decode has
    no prompt logprobs (its input logprobs are empty): the router merges the prefill's in
    front."""
    if not body.get("echo"):
        return None
    prompt = body["prompt"]
    if isinstance(prompt, str):
        texts = [prompt]
    elif all(isinstance(p, str) for p in prompt):
        texts = list(prompt)
    elif all(isinstance(p, list) for p in prompt):
        texts = [tokens.decode(p) for p in prompt]
    else:
        texts = [tokens.decode(prompt)]
    return Echo([texts[i // n] for i in range(len(texts) * n)], bool(body.get("logprobs")))


# -- responses ----------------------------------------------------------------------------


def _finish(state: RequestState) -> tuple[str | None, Any]:
    reason = state.finish
    if reason is None:
        return None, None
    return reason.kind, reason.matched if reason.kind == "stop" else None


@dataclass(frozen=True)
class CacheReport:
    """What a response says about cached prompt tokens: `usage.prompt_tokens_details` with
    the server's --enable-cache-report, `sglext.cached_tokens_details` (device, host, storage)
    when the request sets `return_cached_tokens_details` (SGLang 0.5.23's serving_chat)."""

    usage: bool = False
    details: bool = False


def usage(states: list[RequestState], n: int, cache: CacheReport | None = None) -> dict[str, Any]:
    firsts = [s for i, s in enumerate(states) if i % n == 0]
    prompt = sum(s.inp.prompt_len for s in firsts)
    completion = sum(len(s.output_ids) for s in states)
    cached = sum(s.cached_tokens for s in firsts)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cache and cache.usage else None,
        "reasoning_tokens": 0,
    }


def sglext(states: list[RequestState], cache: CacheReport | None) -> dict[str, Any] | None:
    """The response's `sglext` (None: left out, as SGLang drops it when empty)."""
    if cache is None or not cache.details:
        return None
    details = next((s.cached_details for s in states if s.cached_details is not None), None)
    return {"cached_tokens_details": details} if details is not None else None


def _with_sglext(
    body: dict[str, Any], states: list[RequestState], cache: CacheReport | None
) -> dict[str, Any]:
    ext = sglext(states, cache)
    return {**body, "sglext": ext} if ext is not None else body


def _chat_logprobs(state: RequestState, start: int = 0) -> dict[str, Any]:
    content = []
    k = state.inp.top_logprobs_num
    for i in range(start, len(state.output_ids)):
        token = state.output_ids[i]
        text = tokens.decode_token(token)
        entry: dict[str, Any] = {
            "token": text,
            "bytes": list(text.encode()),
            "logprob": state.logprob_at(i),
            "top_logprobs": [],
        }
        pos = state.inp.prompt_len + i
        for lp, alt in tokens.top_logprobs(pos, token, k) if k else ():
            alt_text = tokens.decode_token(alt)
            entry["top_logprobs"].append(
                {"token": alt_text, "bytes": list(alt_text.encode()), "logprob": lp}
            )
        content.append(entry)
    return {"content": content}


def _completion_logprobs(
    state: RequestState, start: int = 0, with_prompt: bool = False
) -> dict[str, Any]:
    """SGLang's ``to_openai_style_logprobs``: the prompt entries first when `with_prompt`
    (from ``meta_info.input_*``, the first one without a logprob), then the output tokens from
    `start`. SGLang reports every ``text_offset`` as -1 and ``top_logprobs`` only when
    ``logprobs`` > 0."""
    k = state.inp.top_logprobs_num
    meta = state.logprob_meta() if with_prompt else {}
    prompt = meta.get("input_token_logprobs", [])
    ids = state.output_ids[start:]
    out_tokens = [tokens.decode_token(t) for _, t, _ in prompt]
    out_tokens += [tokens.decode_token(t) for t in ids]
    logprobs: list[float | None] = [lp for lp, _, _ in prompt]
    logprobs += [state.logprob_at(i) for i in range(start, len(state.output_ids))]
    top: list[dict[str, float] | None] = []
    if k:
        top += [
            None if alts is None else {tokens.decode_token(t): lp for lp, t, _ in alts}
            for alts in meta.get("input_top_logprobs", [])
        ]
        top += [
            {
                tokens.decode_token(alt): lp
                for lp, alt in tokens.top_logprobs(state.inp.prompt_len + start + i, t, k)
            }
            for i, t in enumerate(ids)
        ]
    return {
        "tokens": out_tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top,
        "text_offset": [-1] * len(out_tokens),
    }


def chat_response(
    states: list[RequestState], model: str, n: int, cache: CacheReport | None = None
) -> dict[str, Any]:
    choices = []
    for i, state in enumerate(states):
        kind, matched = _finish(state)
        choices.append(
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": state.text,
                    "reasoning_content": None,
                    "tool_calls": None,
                },
                "logprobs": _chat_logprobs(state) if state.inp.return_logprob else None,
                "finish_reason": kind,
                "matched_stop": matched,
            }
        )
    body = {
        "id": states[0].inp.rid.split("-")[0],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(states, n, cache),
        "metadata": {"weight_version": "default"},
    }
    return _with_sglext(body, states, cache)


def completion_response(
    states: list[RequestState],
    model: str,
    n: int,
    echo: Echo | None = None,
    cache: CacheReport | None = None,
) -> dict[str, Any]:
    choices = []
    for i, state in enumerate(states):
        kind, matched = _finish(state)
        with_prompt = echo is not None and echo.logprobs
        choices.append(
            {
                "index": i,
                "text": (echo.texts[i] if echo else "") + state.text,
                "logprobs": _completion_logprobs(state, with_prompt=with_prompt)
                if state.inp.return_logprob
                else None,
                "finish_reason": kind,
                "matched_stop": matched,
            }
        )
    body = {
        "id": states[0].inp.rid.split("-")[0],
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(states, n, cache),
        "metadata": {"weight_version": "default"},
    }
    return _with_sglext(body, states, cache)


class StreamFormatter:
    """Turns cumulative sequence states into OpenAI stream chunks (chat or completion)."""

    def __init__(
        self,
        chat: bool,
        model: str,
        states: list[RequestState],
        echo: Echo | None = None,
        *,
        token_ids: bool = False,
    ) -> None:
        self.chat = chat
        # completions with `return_token_ids`: each chunk carries its new ids, the first also
        # the prompt's (serving_completions.py)
        self.token_ids = token_ids and not chat
        self.echo = echo  # completions: put in front of each sequence's first chunk
        self.model = model
        self.states = states
        self.id = states[0].inp.rid.split("-")[0]
        self.created = int(time.time())
        self.sent_text = [0] * len(states)
        self.sent_tokens = [0] * len(states)
        self.started = [False] * len(states)
        self.finished = [False] * len(states)
        obj = "chat.completion.chunk" if chat else "text_completion"
        # Content chunks are the hot path (one per token per stream): only the delta text is
        # encoded; the rest is this prefix. `_chunk` builds the same JSON the slow way.
        self._head = (
            f'data: {{"id":{json.dumps(self.id)},"object":"{obj}","created":{self.created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":'
        )

    def _chunk(
        self,
        index: int,
        delta: dict[str, Any] | str | None,
        finish: str | None,
        logprobs: Any = None,
        matched: Any = None,
        *,
        ids: tuple[list[int], list[int] | None] | None = None,
    ) -> str:
        if self.chat:
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta or {},
                "logprobs": logprobs,
                "finish_reason": finish,
                "matched_stop": matched,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {
                "index": index,
                "text": delta or "",
                "logprobs": logprobs,
                "finish_reason": finish,
                "matched_stop": matched,
            }
            if ids is not None:
                choice["token_ids"], choice["prompt_token_ids"] = ids
            obj = "text_completion"
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": None,
        }
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    def content_chunk(self, index: int, piece: str) -> str:
        """A content delta without logprobs; equal to ``_chunk(index, delta, None)``."""
        text = json.dumps(piece)
        delta = f'"delta":{{"content":{text}}}' if self.chat else f'"text":{text}'
        tail = '"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}'
        return f"{self._head}{index},{delta},{tail}\n\n"

    def updates(self, index: int) -> list[str]:
        """Chunks for whatever `states[index]` produced since the last call."""
        state = self.states[index]
        out = []
        if self.chat and not self.started[index] and state.output_ids:
            self.started[index] = True
            out.append(self._chunk(index, {"role": "assistant", "content": ""}, None))
        text = state.text
        new_tokens = len(state.output_ids) > self.sent_tokens[index]
        echo = self.echo if self.sent_tokens[index] == 0 else None
        grew = len(text) > self.sent_text[index] or state.inp.return_logprob or echo
        if new_tokens and (grew or self.token_ids):
            piece = (echo.texts[index] if echo else "") + text[self.sent_text[index] :]
            if self.token_ids and not state.inp.return_logprob:
                ids = state.output_ids[self.sent_tokens[index] :]
                prompt = state.inp.prompt_ids if self.sent_tokens[index] == 0 else None
                out.append(self._chunk(index, piece, None, ids=(ids, prompt)))
            elif state.inp.return_logprob:
                logprobs = (
                    _chat_logprobs(state, self.sent_tokens[index])
                    if self.chat
                    else _completion_logprobs(
                        state, self.sent_tokens[index], with_prompt=bool(echo and echo.logprobs)
                    )
                )
                delta: dict[str, Any] | str = {"content": piece} if self.chat else piece
                out.append(self._chunk(index, delta, None, logprobs))
            else:
                out.append(self.content_chunk(index, piece))
            self.sent_text[index] = len(text)
        self.sent_tokens[index] = len(state.output_ids)
        if state.done and not self.finished[index]:
            self.finished[index] = True
            kind, matched = _finish(state)
            if kind != "abort":
                out.append(self._chunk(index, {} if self.chat else "", kind, matched=matched))
        return out

    def usage_chunk(self, n: int, cache: CacheReport | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(self.states, n, cache),
        }
        body = _with_sglext(body, self.states, cache)
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def error_body(message: str, status: int, err_type: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's OpenAI ``ErrorResponse``."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def stream_error(message: str, status: int) -> str:
    names = {
        400: "BAD_REQUEST",
        404: "NOT_FOUND",
        500: "INTERNAL_SERVER_ERROR",
        503: "SERVICE_UNAVAILABLE",
    }
    body = {"error": error_body(message, status, names.get(status, str(status)))}
    return f"data: {json.dumps(body)}\n\n"
