"""OpenAI streams whose generated ids the router sees, so that a stream cut by a dead decode can
be continued exactly (`kit.lb.migrate`). What SGLang 0.5.23 offers decides the shape (see
docs/lb.md, "The model's tokenizer and the request checks"):

1. `IdStream.plan` decides, when the request arrives, whether its stream can be followed, and
   what both legs are sent (`IdStream.wire`):
   - `/v1/completions` (one prompt whose ids the router knows, `n` 1, no logprobs, echo or
     suffix): the client's body with `return_token_ids`; every chunk then carries its ids.
   - `/v1/chat/completions` (the prompt's ids from the router's chat template, `n` 1, no
     logprobs, tools or response format): chat refuses `return_token_ids` when streaming, so
     both legs are *bridged* through `/v1/completions`: `prompt` = the ids, every sampling
     field chat would use made explicit (a field left unset takes the model's
     generation_config.json value, as chat does, else chat's default), `max_tokens` the chat's
     or the rest of the context; the chunks are turned back into chat chunks here.
2. `IdStream.event` (the relay's rewriter) records the ids and text of each chunk as it goes
   to the client, and takes out the ids the client did not ask for.
3. When the decode dies, `IdStream.continuation` is the `/v1/completions` request for the
   prompt plus the ids sent, `max_tokens` and `min_tokens` reduced; `IdStream.rejoin` turns
   the continuation's chunks into the rest of the same stream: its text rebuilt from all ids
   with the router's tokenizer (a cut inside a character: the new decode cannot finish a
   character whose first bytes came from the old one), a stop string that begins before the
   cut and ends after it ended here (the new decode checks its own output only), usage
   counted from the original prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kit.lb.protocol import CHAT, COMPLETIONS, Merge, PdRequest, parse_request
from kit.lb.tokenizer import ModelTokenizer

# Chat's defaults for the sampling fields it reads from generation_config.json
# (ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS).
CHAT_SAMPLING_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
# Chat fields that carry over to /v1/completions as they are (same name, same meaning).
_SAME_FIELDS = (
    "model",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "seed",
    "stop_token_ids",
    "stop_regex",
    "min_tokens",
    "regex",
    "ebnf",
    "no_stop_trim",
    "ignore_eos",
    "skip_special_tokens",
    "stream_options",
    "user",
    "rid",
    "lora_path",
    "custom_params",
    "priority",
    "return_cached_tokens_details",
)
# Chat fields that make a bridged stream differ from what chat itself would answer.
_CHAT_ONLY = (
    "tools",
    "tool_choice",
    "functions",
    "response_format",
    "logprobs",
    "top_logprobs",
    "continue_final_message",
    "reasoning_effort",
    "separate_reasoning",
    "stream_reasoning",
    "return_hidden_states",
    "return_prompt_token_ids",
    "return_token_ids",
    "input_ids",
)
# SGLang's detokenizer decodes an output against the prompt's last tokens (surr_offset).
SURROUND = 5


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class IdStream:
    """One followed OpenAI stream: what was sent to the client (ids, text) and how to go on."""

    def __init__(
        self,
        client: PdRequest,
        wire: PdRequest,
        prompt: Sequence[int],
        tokenizer: ModelTokenizer | None,
    ) -> None:
        self.client = client  # the request as the client sent it
        self.wire = wire  # what both legs get (completions, with return_token_ids)
        self.prompt = list(prompt)
        self.chat = client.path == CHAT
        self.keep_ids = client.body.get("return_token_ids") is True and not self.chat
        self.tokenizer = tokenizer
        self.ids: list[int] = []  # generated ids the client got
        self.text = ""  # text the client got
        self.finished = False  # a finish_reason went out
        self.exact = True  # every chunk with text carried its ids
        self.role_sent = False  # chat: the assistant role chunk went out
        self.cut = 0  # ids before the last cut (usage of a continuation)
        self.joined = False  # events now come from a continuation
        self._surround = ""
        self._join_at = 0  # len(text) at the last join
        self._matched: str | None = None  # a stop string found across the join
        stop = wire.body.get("stop")
        self.stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if s]
        self.no_stop_trim = wire.body.get("no_stop_trim") is True

    # -- 1. the plan -------------------------------------------------------------------------

    @classmethod
    def plan(
        cls,
        pd: PdRequest,
        tokenizer: ModelTokenizer | None,
        context_length: int | None,
        bridge_chat: bool = True,
    ) -> IdStream | None:
        """The followed stream of `pd`, or None when its stream cannot be continued exactly
        (a chat without `bridge_chat`: its workers parse what completions would not)."""
        ids = pd.ids
        body = pd.body
        if not pd.stream or not ids or pd.merge is not Merge.NONE or pd.batch_size:
            return None
        if (body.get("n") or 1) != 1:
            return None
        if pd.path == COMPLETIONS:
            if body.get("echo") or body.get("suffix") or body.get("logprobs"):
                return None
            if body.get("return_token_ids") is True:
                return cls(pd, pd, ids, tokenizer)
            wire = {**body, "return_token_ids": True}
            return cls(pd, parse_request(COMPLETIONS, _dumps(wire)), ids, tokenizer)
        if pd.path != CHAT or not bridge_chat or any(body.get(key) for key in _CHAT_ONLY):
            return None
        bridged = bridge_body(body, ids, tokenizer, context_length)
        if bridged is None:
            return None
        return cls(pd, parse_request(COMPLETIONS, _dumps(bridged)), ids, tokenizer)

    # -- 2. the chunks as they go to the client ----------------------------------------------

    def event(self, payload: bytes) -> bytes:
        """One `data:` payload of the decode's stream, as the client gets it (b":" drops it:
        an SSE comment)."""
        try:
            chunk = json.loads(payload)
        except ValueError:
            return payload
        if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
            return payload
        if self.finished and chunk.get("choices"):
            return b":"  # past a stop string found at the join
        if self.joined:
            self._rejoin_usage(chunk)
        choices = chunk.get("choices") or []
        text = ""
        finish = None
        choice: dict[str, Any] = choices[0] if choices and isinstance(choices[0], dict) else {}
        if choice:
            if "token_ids" not in choice and choice.get("text"):
                self.exact = False  # a worker that does not answer return_token_ids
            new_ids = choice.pop("token_ids", None) or []
            prompt_ids = choice.pop("prompt_token_ids", None)
            self.ids.extend(int(t) for t in new_ids)
            text = choice.get("text") or ""
            finish = choice.get("finish_reason")
            if self.joined:
                text = self._joined_text(text, final=finish is not None)
                prompt_ids = None
            if self.joined and finish is None:
                stop = self._straddling(text)
                if stop is not None:
                    text, finish = stop, "stop"
                    choice["matched_stop"] = self._matched
            choice["text"] = text
            self.text += text
            if finish is not None:
                self.finished = True
                choice["finish_reason"] = finish
            if self.keep_ids:
                choice["token_ids"] = new_ids
                if prompt_ids is not None:
                    choice["prompt_token_ids"] = prompt_ids
        if not self.chat:
            return _dumps(chunk)
        return self._as_chat(chunk, choice, text, finish)

    def _as_chat(
        self, chunk: dict[str, Any], choice: dict[str, Any], text: str, finish: Any
    ) -> bytes:
        """Completions chunk -> chat chunks (serving_chat.py's shapes): the assistant role
        first, content deltas, the finish with an empty delta, usage with no choices."""
        head: dict[str, Any] = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        head["object"] = "chat.completion.chunk"

        def one(delta: dict[str, Any], finish_reason: Any, matched: Any = None) -> bytes:
            item = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
            return _dumps({**head, "choices": [item], "usage": None})

        if not choice:  # usage, or SGLang's extensions (sglext: cached tokens by source)
            extra = {"sglext": chunk["sglext"]} if chunk.get("sglext") is not None else {}
            return _dumps({**head, "choices": [], "usage": chunk.get("usage"), **extra})
        out = []
        if not self.role_sent:
            self.role_sent = True
            out.append(one({"role": "assistant", "content": ""}, None))
        if text:
            out.append(one({"content": text}, None))
        if finish is not None:
            out.append(one({}, finish, choice.get("matched_stop")))
        return b"\n\ndata: ".join(out) if out else b":"

    # -- 3. the continuation -----------------------------------------------------------------

    def continuation(self) -> PdRequest | None:
        """The `/v1/completions` request that continues the stream after what the client got
        (None: nothing is left to generate)."""
        if self.finished:
            return None
        body = dict(self.wire.body)
        budget = body.get("max_tokens")
        left = (budget if isinstance(budget, int) else 16) - len(self.ids)
        if left <= 0:
            return None
        body["max_tokens"] = left
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(body["min_tokens"] - len(self.ids), 0)
        body["prompt"] = [*self.prompt, *self.ids]
        body["return_token_ids"] = True
        return parse_request(COMPLETIONS, _dumps(body))

    def rejoin(self) -> IdStream:
        """Take the continuation's events from now on (the rewriter of the new decode)."""
        self.joined = True
        self.cut = len(self.ids)
        self._join_at = len(self.text)
        if self.tokenizer is not None:
            self._surround = self._decode([])
        return self

    def _decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        skip = self.wire.body.get("skip_special_tokens", True) is not False
        return self.tokenizer.decode([*self.prompt[-SURROUND:], *ids], skip_special_tokens=skip)

    def _joined_text(self, text: str, *, final: bool = False) -> str:
        """A continuation's text delta: rebuilt from every id with the router's tokenizer
        where there is one (exact across a character cut by the join), else the new decode's.
        The `final` chunk (its finish_reason set) gives all that is left, an incomplete
        character as U+FFFD included: SGLang's detokenizer flushes it at the end."""
        if self.tokenizer is None:
            return text
        full = self._decode(self.ids)
        if not full.startswith(self._surround):
            return text
        full = full[len(self._surround) :]
        if full.endswith("\ufffd") and not final:  # incomplete: held back, as SGLang does
            full = full[:-1]
        if not full.startswith(self.text):
            return text
        return full[len(self.text) :]

    def _straddling(self, delta: str) -> str | None:
        """The text to send when a stop string began before the join and ends in `delta`
        (None: there is none): nothing more (the stop trimmed), or up to its end with
        `no_stop_trim`."""
        join = self._join_at
        full = self.text + delta
        for stop in self.stops:
            found = full.find(stop, max(0, join - len(stop) + 1))
            if 0 <= found < join and found + len(stop) > join:
                self._matched = stop
                return full[len(self.text) : found + len(stop)] if self.no_stop_trim else ""
        return None

    def _rejoin_usage(self, chunk: dict[str, Any]) -> None:
        """Usage as for the original prompt: the continuation's prompt held the ids sent."""
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            return
        prompt = len(self.prompt)
        if isinstance(usage.get("completion_tokens"), int):
            usage["completion_tokens"] += self.cut
            if self.finished and self._matched is not None:
                usage["completion_tokens"] = len(self.ids)
        usage["prompt_tokens"] = prompt
        if isinstance(usage.get("completion_tokens"), int):
            usage["total_tokens"] = prompt + usage["completion_tokens"]


def bridge_body(
    chat: Mapping[str, Any],
    ids: Sequence[int],
    tokenizer: ModelTokenizer | None,
    context_length: int | None,
) -> dict[str, Any] | None:
    """The `/v1/completions` body that generates what a `/v1/chat/completions` body would
    (ChatCompletionRequest.to_sampling_params), or None when the router cannot tell."""
    body: dict[str, Any] = {key: chat[key] for key in _SAME_FIELDS if key in chat}
    body["prompt"] = list(ids)
    body["stream"] = True
    body["return_token_ids"] = True
    defaults = tokenizer.sampling_defaults if tokenizer is not None else {}
    for key, fallback in CHAT_SAMPLING_DEFAULTS.items():
        value = chat.get(key)
        body[key] = value if value is not None else defaults.get(key, fallback)
    if isinstance(body["top_k"], float) and body["top_k"].is_integer():
        body["top_k"] = int(body["top_k"])
    stop = chat.get("stop")
    if stop is not None:
        body["stop"] = stop
    budget = chat.get("max_completion_tokens") or chat.get("max_tokens")
    if budget is None:
        if context_length is None:
            return None
        budget = context_length - len(ids)  # chat's None: up to the context
    if not isinstance(budget, int) or budget <= 0:
        return None
    body["max_tokens"] = budget
    return body
