"""The fake model: deterministic tokens and logprobs, and SGLang's response shapes in PD.

Output token k is id 500 + k with text " t{k}"; a prompt's token ids come from its words (or
are the ids given). Logprobs follow SGLang in PD: the prefill returns the input logprobs and its
one output token, the decode empty input logprobs and every output token; a `null` (non-PD)
worker returns both. Streamed /generate events carry the whole text so far, as SGLang's do.
"""

from __future__ import annotations

import json
from functools import cached_property, lru_cache
from typing import Any

MODEL = "fake-model"
NATIVE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def lp(token_id: int, position: int) -> float:
    """The fake model's logprob of a token at a position (deterministic)."""
    return -round(0.1 + (token_id % 7) * 0.05 + position * 0.001, 6)


def prompt_ids(prompt: Any) -> list[int]:
    """Token ids of a prompt: the ids themselves, or one id per word of a text."""
    if isinstance(prompt, list):
        return [int(t) for t in prompt]
    return [sum(word.encode()) % 997 + 3 for word in str(prompt).split()] or [1]


def prompt_len(prompt: Any) -> int:
    """len(prompt_ids(prompt)), without computing the ids."""
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split()) or 1


def out_token(k: int) -> tuple[int, str]:
    """Output token k: (id, text)."""
    return 500 + k, f" t{k}"


@lru_cache(maxsize=4096)
def _text(upto: int) -> str:
    return "".join(out_token(k)[1] for k in range(upto))


# Encoded answers that depend only on the role, the path, the token count and the prompt lengths
# (no logprobs, no echo), so that a benchmark does not measure the fake's JSON encoding.
_CACHE: dict[tuple[Any, ...], Any] = {}
_CACHE_MAX = 4096


class Shapes:
    """Response bodies of one worker role for one parsed request."""

    def __init__(self, role: str, path: str, body: dict[str, Any], batch: int | None) -> None:
        self.role, self.path, self.body, self.batch = role, path, body, batch
        if role == "prefill":
            self.n_out = 1
        elif path == NATIVE:
            self.n_out = int((body.get("sampling_params") or {}).get("max_new_tokens", 4))
        else:
            self.n_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)

    @cached_property
    def _sources(self) -> list[Any]:
        """The prompt of each item: a text or a list of ids (chat: the messages' contents)."""
        body = self.body
        if self.path == NATIVE:
            source: Any = body["text"] if body.get("text") is not None else body.get("input_ids")
            return list(source) if self.batch is not None else [source]
        if self.path == COMPLETIONS:
            return [body["prompt"]]
        return [" ".join(str(m.get("content", "")) for m in body["messages"])]

    @cached_property
    def prompts(self) -> list[list[int]]:
        return [prompt_ids(item) for item in self._sources]

    def _cache_key(self) -> tuple[Any, ...] | None:
        """The key of this answer in `_CACHE`, or None when it depends on the prompt's ids."""
        body = self.body
        if self.path == NATIVE:
            if body.get("return_logprob"):
                return None
        elif self.path == COMPLETIONS:
            if body.get("logprobs") is not None or body.get("echo"):
                return None
        elif body.get("logprobs"):
            return None
        lengths = tuple(prompt_len(item) for item in self._sources)
        return (self.role, self.path, self.n_out, self.batch, lengths)

    def _cached(self, kind: str, build: Any) -> Any:
        key = self._cache_key()
        if key is None:
            return build()
        key = (kind, *key)
        found = _CACHE.get(key)
        if found is None:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            found = _CACHE[key] = build()
        return found

    def result_bytes(self) -> bytes:
        """The whole (non-streamed) answer, encoded."""
        return self._cached("result", lambda: json.dumps(self.result()).encode())  # type: ignore[no-any-return]

    def events(self) -> list[bytes]:
        """The SSE events of the streamed answer, one per token (then `[DONE]`, not included)."""
        return self._cached("events", self._events)  # type: ignore[no-any-return]

    @property
    def _has_input(self) -> bool:
        """Whether this role returns the prompt's logprobs (the decode never does in PD)."""
        return self.role != "decode"

    def native_item(self, prompt: list[int], logprob: bool, upto: int) -> dict[str, Any]:
        n_out = self.n_out
        meta: dict[str, Any] = {
            "id": "fake",
            "prompt_tokens": len(prompt),
            "completion_tokens": upto,
            "finish_reason": {"type": "length", "length": n_out} if upto == n_out else None,
        }
        ids = [out_token(k)[0] for k in range(upto)]
        if logprob:
            meta["input_token_logprobs"] = (
                [[None if i == 0 else lp(t, i), t, None] for i, t in enumerate(prompt)]
                if self._has_input
                else []
            )
            meta["output_token_logprobs"] = [
                [lp(t, len(prompt) + k), t, None] for k, t in enumerate(ids)
            ]
        return {"text": _text(upto), "output_ids": ids, "meta_info": meta}

    def completion_lp(
        self, prompt: list[int], upto: int, echo: bool, start: int = 0
    ) -> dict[str, Any]:
        entries: list[tuple[str, float | None]] = []
        if echo and self._has_input and start == 0:
            entries += [(f"p{t}", None if i == 0 else lp(t, i)) for i, t in enumerate(prompt)]
        for k in range(start, upto):
            token_id, text = out_token(k)
            entries.append((text, lp(token_id, len(prompt) + k)))
        return {
            "tokens": [e[0] for e in entries],
            "token_logprobs": [e[1] for e in entries],
            "text_offset": [-1] * len(entries),
            "top_logprobs": [{} for _ in entries],
        }

    def result(self) -> Any:
        """The whole (non-streamed) answer."""
        body, n_out, prompts = self.body, self.n_out, self.prompts
        if self.path == NATIVE:
            logprob = bool(body.get("return_logprob"))
            items = [self.native_item(p, logprob, n_out) for p in prompts]
            return items if self.batch is not None else items[0]
        usage = {
            "prompt_tokens": len(prompts[0]),
            "completion_tokens": n_out,
            "total_tokens": len(prompts[0]) + n_out,
        }
        if self.path == COMPLETIONS:
            echo = bool(body.get("echo"))
            logprobs = (
                self.completion_lp(prompts[0], n_out, echo)
                if body.get("logprobs") is not None
                else None
            )
            return {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 0,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "text": (body["prompt"] if echo else "") + _text(n_out),
                        "logprobs": logprobs,
                        "finish_reason": "length",
                    }
                ],
                "usage": usage,
            }
        chat_lp = None
        if body.get("logprobs"):
            chat_lp = {
                "content": [
                    {
                        "token": out_token(k)[1],
                        "logprob": lp(out_token(k)[0], len(prompts[0]) + k),
                        "top_logprobs": [],
                    }
                    for k in range(n_out)
                ]
            }
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _text(n_out)},
                    "logprobs": chat_lp,
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
        }

    def _events(self) -> list[bytes]:
        events: list[Any] = []
        for k in range(1, self.n_out + 1):
            if self.path == NATIVE:
                events += self._native_event(k)
            elif self.path == COMPLETIONS:
                events.append(self._completion_event(k))
            else:
                events.append(self._chat_event(k))
        return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]

    def _native_event(self, k: int) -> list[dict[str, Any]]:
        logprob = bool(self.body.get("return_logprob"))
        out = []
        for i, p in enumerate(self.prompts):
            item = self.native_item(p, logprob, k)
            if self.batch is not None:
                item["index"] = i
            out.append(item)
        return out

    def _completion_event(self, k: int) -> dict[str, Any]:
        body = self.body
        echo = bool(body.get("echo"))
        text = out_token(k - 1)[1]
        if echo and k == 1:
            text = body["prompt"] + text
        lp_obj = (
            self.completion_lp(self.prompts[0], k, echo, start=k - 1)
            if body.get("logprobs") is not None
            else None
        )
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": lp_obj,
            "finish_reason": "length" if k == self.n_out else None,
        }
        if body.get("return_token_ids") is True:  # serving_completions: each chunk's ids
            choice["token_ids"] = [out_token(k - 1)[0]]
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
        }

    def _chat_event(self, k: int) -> dict[str, Any]:
        token_id, text = out_token(k - 1)
        delta: dict[str, Any] = {"content": text}
        if k == 1:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "finish_reason": "length" if k == self.n_out else None,
        }
        if self.body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {
                        "token": text,
                        "logprob": lp(token_id, len(self.prompts[0]) + k - 1),
                        "top_logprobs": [],
                    }
                ]
            }
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [choice],
        }
