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
import uuid
from dataclasses import dataclass
from typing import Any

from kit.sim import tokens
from kit.sim.api_native import ApiError, optional_index, parse_sampling, sequence_input
from kit.sim.requests import GenerateInput, RequestState


def _validation(message: str) -> ApiError:
    return ApiError(message)


def _common(body: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """OpenAI fields -> SGLang sampling params (validated by the same rules)."""
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise _validation("max_tokens must be positive")
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": body.get("min_tokens", 0),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "frequency_penalty": body.get("frequency_penalty"),
        "presence_penalty": body.get("presence_penalty"),
        "stop": body.get("stop"),
        "stop_token_ids": body.get("stop_token_ids"),
        "ignore_eos": body.get("ignore_eos", False),
        "no_stop_trim": body.get("no_stop_trim", False),
        "n": body.get("n", 1),
    }
    return {k: v for k, v in params.items() if v is not None}


def _inputs(
    body: dict[str, Any],
    prompts: list[list[int]],
    params: dict[str, Any],
    default_max: int,
    logprobs: int | None,
    *,
    logprob_start_len: int = -1,
) -> list[GenerateInput]:
    params.setdefault("max_new_tokens", default_max)
    sampling = parse_sampling(params)
    room = optional_index(body.get("bootstrap_room"), "bootstrap_room")
    rid = uuid.uuid4().hex
    out = []
    for p, prompt in enumerate(prompts):
        for j in range(sampling.n):
            index = p * sampling.n + j
            out.append(
                sequence_input(
                    rid if len(prompts) * sampling.n == 1 else f"{rid}-{index}",
                    prompt,
                    sampling,
                    sample_index=j,
                    stream=bool(body.get("stream")),
                    top_logprobs_num=logprobs,
                    logprob_start_len=logprob_start_len,
                    bootstrap_host=body.get("bootstrap_host"),
                    bootstrap_port=body.get("bootstrap_port"),
                    bootstrap_room=None if room is None else room + index,
                    routed_dp_rank=body.get("routed_dp_rank"),
                )
            )
    return out


def parse_completion(body: Any, vocab: int) -> list[GenerateInput]:
    """Sequences for a /v1/completions body (``max_tokens`` defaults to 16, as in OpenAI)."""
    if not isinstance(body, dict) or "prompt" not in body:
        raise _validation("1 validation error for CompletionRequest\nprompt\n  Field required")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        prompts = [tokens.encode(prompt, vocab)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tokens.encode(p, vocab) for p in prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [list(prompt)]
    else:
        raise _validation("prompt must be a string, a list of strings or a list of token ids")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or logprobs < 0):
        raise _validation("logprobs must be a non-negative integer")
    params = _common(body, body.get("max_tokens", 16))
    # serving_completions: prompt logprobs only for echo with logprobs
    start = 0 if body.get("echo") and logprobs else -1
    return _inputs(body, prompts, params, 16, logprobs, logprob_start_len=start)


@dataclass(frozen=True)
class Echo:
    """Per sequence: the echoed prompt text; whether the prompt logprobs are echoed too."""

    texts: list[str]
    logprobs: bool


def completion_echo(body: dict[str, Any]) -> Echo | None:
    """What ``echo: true`` puts in front of each sequence of a /v1/completions answer, as
    SGLang's serving_completions does: the prompt text (token-id prompts decoded), and, when
    ``logprobs`` is positive, the prompt logprobs. A PD decode has no prompt logprobs (its
    input logprobs are empty): the router merges the prefill's in front."""
    if not body.get("echo"):
        return None
    prompt = body["prompt"]
    if isinstance(prompt, str):
        texts = [prompt]
    elif all(isinstance(p, str) for p in prompt):
        texts = list(prompt)
    else:
        texts = [tokens.decode(prompt)]
    n = max(1, int(body.get("n") or 1))
    return Echo([texts[i // n] for i in range(len(texts) * n)], bool(body.get("logprobs")))


def parse_chat(body: Any, vocab: int, context_len: int) -> list[GenerateInput]:
    """Sequences for a /v1/chat/completions body; without ``max_tokens`` the answer may run
    to the context length (the emulated EOS usually ends it first)."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("messages"), list)
        or not body["messages"]
    ):
        raise _validation(
            "1 validation error for ChatCompletionRequest\nmessages\n  Field required"
        )
    for message in body["messages"]:
        if not isinstance(message, dict) or "role" not in message:
            raise _validation("each message needs a role")
    prompt = tokens.encode(tokens.render_chat(body["messages"]), vocab)
    top = body.get("top_logprobs")
    logprobs = int(top or 0) if body.get("logprobs") else None
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    params = _common(body, max_tokens)
    return _inputs(body, [prompt], params, max(context_len - len(prompt), 1), logprobs)


# -- responses ----------------------------------------------------------------------------


def _finish(state: RequestState) -> tuple[str | None, Any]:
    reason = state.finish
    if reason is None:
        return None, None
    return reason.kind, reason.matched if reason.kind == "stop" else None


def usage(states: list[RequestState], n: int) -> dict[str, Any]:
    prompt = sum(s.inp.prompt_len for i, s in enumerate(states) if i % n == 0)
    completion = sum(len(s.output_ids) for s in states)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


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


def chat_response(states: list[RequestState], model: str, n: int) -> dict[str, Any]:
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
    return {
        "id": states[0].inp.rid.split("-")[0],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(states, n),
        "metadata": {"weight_version": "default"},
    }


def completion_response(
    states: list[RequestState], model: str, n: int, echo: Echo | None = None
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
    return {
        "id": states[0].inp.rid.split("-")[0],
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(states, n),
        "metadata": {"weight_version": "default"},
    }


class StreamFormatter:
    """Turns cumulative sequence states into OpenAI stream chunks (chat or completion)."""

    def __init__(
        self, chat: bool, model: str, states: list[RequestState], echo: Echo | None = None
    ) -> None:
        self.chat = chat
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
        if new_tokens and (len(text) > self.sent_text[index] or state.inp.return_logprob or echo):
            piece = (echo.texts[index] if echo else "") + text[self.sent_text[index] :]
            if state.inp.return_logprob:
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

    def usage_chunk(self, n: int) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(self.states, n),
        }
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
