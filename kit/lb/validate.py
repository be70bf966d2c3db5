"""Requests the router refuses before any worker sees them: what SGLang 0.5.23 would crash on,
or refuse only after a prefill and a decode both took it.

Found in SGLang 0.5.23's source (docs/router.md lists them with the same references):

1. An input id outside ``[0, vocab_size)`` (``input_ids`` of /generate and chat, a token-id
   ``prompt`` of /v1/completions): `TokenizerManager._tokenize_one_request`
   (managers/tokenizer_manager.py:1118-1119) takes ``input_ids`` unchecked, and only
   ``token_ids_logprob`` is checked against the vocabulary (:1510-1531); the embedding's index
   error kills the scheduler, and with it the whole server. **A crash.**
2. A prompt of ``context_length`` tokens or more (:1338-1351) and a prompt plus ``max_new_tokens``
   past the context (:1353-1379): refused by each server with a 400, after the router has
   picked and reserved a pair; refused here at once, with the same numbers.
3. An empty id list (`input_ids: []`): refused by SGLang as "input_ids cannot be empty."
   (managers/io_struct.py:499) and by the sim; refused here with the same words.

The router (`kit.lb.server`) runs `check_request` on every PD request before it picks a worker,
unless started with ``--no-validate``, with the vocabulary and context of its tokenizer
(``--prompt-tokens``) and ``--context-length``.

`check_ids` and `check_length` are pure: they return the problem as a `Refusal` (the message and
the request field it names) or None; the router turns a refusal into a 400 in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: `message` for the client, `param` the body field at fault,
    `cause` the low-cardinality metrics label."""

    message: str
    param: str
    cause: str


def check_ids(ids: Sequence[int], vocab_size: int, *, param: str) -> Refusal | None:
    """An id list a client sent: not empty, every id in ``[0, vocab_size)``."""
    if not ids:
        return Refusal(f"{param} cannot be empty.", param, "empty_prompt")
    for position, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            return Refusal(
                f"{param}[{position}] is {token_id}, outside the model's vocabulary: token ids "
                f"must be in [0, {vocab_size}). SGLang would crash on it.",
                param,
                "token_out_of_vocabulary",
            )
    return None


def check_length(
    prompt_tokens: int, max_new_tokens: int | None, context_length: int
) -> Refusal | None:
    """A prompt that leaves no room in the context: SGLang's own two checks and messages."""
    if prompt_tokens >= context_length:
        return Refusal(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens).",
            "messages",
            "prompt_too_long",
        )
    if max_new_tokens is not None and prompt_tokens + max_new_tokens > context_length:
        return Refusal(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of "
            f"{prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit.",
            "max_tokens",
            "prompt_too_long",
        )
    return None


def sent_ids(path: str, body: Mapping[str, Any]) -> tuple[str, list[list[int]]] | None:
    """The token ids a client sent itself, as (field, one list per prompt), or None."""
    field = "prompt" if path == "/v1/completions" else "input_ids"
    value = body.get(field)
    if not isinstance(value, list):
        return None
    if value and all(isinstance(v, list) for v in value):
        rows = value
    elif field == "prompt" and value and isinstance(value[0], str):
        return None  # a batch of texts
    else:
        rows = [value]
    if not all(_ints(row) for row in rows):
        return None  # a shape SGLang refuses itself (422)
    return field, [list(row) for row in rows]


def max_new_tokens(path: str, body: Mapping[str, Any]) -> int | None:
    """The completion budget a request asks for, as SGLang reads it: /generate's
    ``sampling_params.max_new_tokens``; /v1/completions' ``max_tokens`` (16 when absent,
    protocol.py:378); chat's ``max_completion_tokens`` or ``max_tokens`` (none when absent)."""
    if path == "/generate":
        params = body.get("sampling_params")
        value = params.get("max_new_tokens") if isinstance(params, Mapping) else None
    elif path == "/v1/completions":
        value = body.get("max_tokens", 16)
    else:
        # protocol.py:1214: ``max_completion_tokens or max_tokens``
        value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_request(
    path: str,
    body: Mapping[str, Any],
    prompt_ids: Sequence[int] | None,
    *,
    vocab_size: int | None,
    context_length: int | None,
) -> Refusal | None:
    """Every check for one request: the ids it sent (when the vocabulary is known), then its
    length (when its ids and the context are known)."""
    sent = sent_ids(path, body) if vocab_size is not None else None
    if sent is not None and vocab_size is not None:
        field, rows = sent
        for row in rows:
            if refusal := check_ids(row, vocab_size, param=field):
                return refusal
    if prompt_ids is not None and context_length is not None:
        return check_length(len(prompt_ids), max_new_tokens(path, body), context_length)
    return None


def _ints(row: object) -> bool:
    return isinstance(row, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in row
    )
