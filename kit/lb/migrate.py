"""Stream migration: what continues a stream cut mid-way on another pair, exactly.

When a decode dies or stalls after the client got some tokens, the request goes to a fresh
pair with the prompt plus the tokens already sent, and the new decode's events are rewritten
so that the client sees one unbroken stream (text and ids so far, usage counted from the
original prompt). What SGLang 0.5.23 accepts decides where that is exact:

- `/generate` with `input_ids` (one sequence, `n` 1): exact. The events carry the cumulative
  `text` and `output_ids` (`incremental_streaming_output` off, the default), so the last
  event relayed holds every token sent; the continuation is `input_ids` = prompt + those ids
  with `max_new_tokens` reduced by their count (SGLang's default is 128). The new decode's
  text starts where the old one stopped: SGLang's detokenizer decodes the output against the
  prompt's last tokens (`surr_offset`), so the pieces concatenate to the unbroken text.
- `/generate` with `text`: not exact. The ids of the prompt are not in the events unless
  `return_prompt_token_ids` is asked (then in every event, the whole prompt each time), and
  re-tokenizing prompt + generated text may give other tokens than were sampled.
- `/v1/completions`: its streamed chunks carry only text deltas; `return_token_ids` adds the
  ids, but the client has to ask for it, so this router does not continue them yet.
- `/v1/chat/completions`: not exact. The request takes `input_ids` (the templated prompt) but
  a stream returns the output ids only at its end (`sglext`, `return_output_ids_in_sglext`;
  `return_token_ids` is refused with streaming), and `continue_final_message` re-tokenizes
  the assistant's partial text.

Where it is not exact, the stream ends with an error event that says so. Pure functions; the
orchestration is `kit.lb.dispatch`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kit.lb.protocol import GENERATE, Merge, PdRequest, parse_request

# SGLang's default max_new_tokens (sampling_params.py) when the request gives none.
DEFAULT_MAX_NEW_TOKENS = 128


def refusal(pd: PdRequest) -> str | None:
    """Why a cut stream of this request cannot be continued exactly (None: it can)."""
    if pd.path != GENERATE:
        return "a stream of /v1/completions or /v1/chat/completions carries no token ids"
    body = pd.body
    if pd.batch_size is not None:
        return "a batched /generate"
    ids = body.get("input_ids")
    if not isinstance(ids, list) or body.get("text") is not None:
        return "the prompt is text, not input_ids"
    params = body.get("sampling_params") or {}
    if (params.get("n") or 1) != 1:
        return "parallel samples (n > 1)"
    if pd.merge is not Merge.NONE:
        return "logprobs are asked"
    return None


@dataclass(frozen=True, slots=True)
class Sent:
    """What the client got so far: the cumulative text and ids, and the original usage."""

    text: str
    output_ids: list[int]
    prompt_tokens: int


def last_event(data: bytes) -> dict[str, Any] | None:
    """The last JSON `data:` event of a relayed piece of stream (None when there is none)."""
    for line in reversed(data.split(b"\n")):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                try:
                    event = json.loads(payload)
                except ValueError:
                    return None
                return event if isinstance(event, dict) else None
    return None


def sent_so_far(pd: PdRequest, last: bytes | None) -> Sent:
    """What the client got, from the last events relayed (`/generate` events are cumulative)."""
    event = last_event(last) if last else None
    prompt = len(pd.body["input_ids"])
    if event is None:
        return Sent("", [], prompt)
    ids = event.get("output_ids")
    meta = event.get("meta_info")
    if not isinstance(meta, dict):
        meta = {}
    text = event.get("text")
    return Sent(
        text if isinstance(text, str) else "",
        [int(t) for t in ids] if isinstance(ids, list) else [],
        int(meta.get("prompt_tokens", prompt)),
    )


def continuation(pd: PdRequest, sent: Sent) -> PdRequest | None:
    """The request that continues the stream after `sent` (None: nothing is left to
    generate)."""
    body = dict(pd.body)
    params = dict(body.get("sampling_params") or {})
    budget = params.get("max_new_tokens")
    left = (budget if isinstance(budget, int) else DEFAULT_MAX_NEW_TOKENS) - len(sent.output_ids)
    if left <= 0:
        return None
    params["max_new_tokens"] = left
    if isinstance(params.get("min_new_tokens"), int):
        params["min_new_tokens"] = max(params["min_new_tokens"] - len(sent.output_ids), 0)
    body["sampling_params"] = params
    body["input_ids"] = [*pd.body["input_ids"], *sent.output_ids]
    raw = json.dumps(body, separators=(",", ":")).encode()
    return parse_request(pd.path, raw)


class Rejoin:
    """Rewrites the continuation's events into the original stream's: text and ids so far
    in front, usage as if from the original prompt. Has `StreamMerger`'s `event` shape."""

    def __init__(self, sent: Sent) -> None:
        self.sent = sent

    def event(self, payload: bytes) -> bytes:
        try:
            event = json.loads(payload)
        except ValueError:
            return payload
        if not isinstance(event, dict) or "error" in event:
            return payload
        sent = self.sent
        if isinstance(event.get("text"), str):
            event["text"] = sent.text + event["text"]
        if isinstance(event.get("output_ids"), list):
            event["output_ids"] = [*sent.output_ids, *event["output_ids"]]
        meta = event.get("meta_info")
        if isinstance(meta, dict):
            n = len(sent.output_ids)
            if isinstance(meta.get("completion_tokens"), int):
                meta["completion_tokens"] += n
            if isinstance(meta.get("prompt_tokens"), int):
                meta["prompt_tokens"] = sent.prompt_tokens
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
