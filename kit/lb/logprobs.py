"""Merging prefill's prompt logprobs into decode's response.

In PD the prefill computes the prompt (input) logprobs; the decode returns the output ones (its
first output token's logprob is copied from prefill) and empty input ones. So:

- native `/generate` with `return_logprob`: every `meta_info.input_*logprobs` list of the prefill
  goes in front of decode's (per batch item; in a stream, in every event, as SGLang repeats the
  input logprobs there), unless decode's list already starts with it (an emulated decode may
  return the prompt logprobs itself: they are not counted twice);
- `/v1/completions` with `echo` and `logprobs`: each choice's `logprobs` (tokens,
  token_logprobs, text_offset, top_logprobs) is prefill's prompt part followed by decode's. The
  prefill's entries end with its one output token, which decode repeats; that overlap is
  counted once;
- `/v1/chat/completions` has no prompt logprobs in the OpenAI format: nothing to merge.

A response that cannot be parsed is passed on unchanged: merging never turns a good answer into
an error.
"""

from __future__ import annotations

import json
from typing import Any

from kit.lb.protocol import Merge

INPUT_KEYS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")
_COMPLETION_KEYS = ("tokens", "token_logprobs", "text_offset", "top_logprobs")


def _merge_meta(prefill_meta: Any, decode_item: Any) -> None:
    if not isinstance(prefill_meta, dict) or not isinstance(decode_item, dict):
        return
    meta = decode_item.get("meta_info")
    if not isinstance(meta, dict):
        return
    for key in INPUT_KEYS:
        head = prefill_meta.get(key)
        if not isinstance(head, list):
            continue
        tail = meta.get(key)
        if not isinstance(tail, list):
            meta[key] = list(head)
        elif tail[: len(head)] != head:  # a decode that already has them is left alone
            meta[key] = head + tail


def merge_native(prefill: Any, decode: Any) -> Any:
    """Merge a `/generate` response (an object, or a list for a batch); returns `decode`."""
    if isinstance(decode, list) and isinstance(prefill, list):
        for p_item, d_item in zip(prefill, decode, strict=False):
            if isinstance(p_item, dict):
                _merge_meta(p_item.get("meta_info"), d_item)
    elif isinstance(decode, dict) and isinstance(prefill, dict):
        _merge_meta(prefill.get("meta_info"), decode)
    return decode


def _entries(lp: dict[str, Any]) -> list[tuple[Any, Any]]:
    return list(zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], strict=False))


def merge_choice_logprobs(prefill_lp: Any, decode_lp: Any) -> Any:
    """Prefill's prompt logprobs in front of decode's for one completion choice."""
    if not isinstance(prefill_lp, dict) or not isinstance(decode_lp, dict):
        return decode_lp
    p_entries, d_entries = _entries(prefill_lp), _entries(decode_lp)
    overlap = 0
    for k in range(1, min(len(p_entries), len(d_entries)) + 1):
        if p_entries[-k:] == d_entries[:k]:
            overlap = k
            break
    prompt_len = len(p_entries) - overlap
    if prompt_len <= 0 or d_entries[:prompt_len] == p_entries[:prompt_len]:
        return decode_lp  # nothing to add, or decode already has the prompt part
    for key in _COMPLETION_KEYS:
        head = prefill_lp.get(key)
        if isinstance(head, list):
            tail = decode_lp.get(key)
            decode_lp[key] = head[:prompt_len] + (tail if isinstance(tail, list) else [])
    return decode_lp


def _choices_by_index(response: Any) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    if isinstance(response, dict):
        for position, choice in enumerate(response.get("choices") or []):
            if isinstance(choice, dict):
                index = choice.get("index", position)
                out[index if isinstance(index, int) else position] = choice
    return out


def merge_echo(prefill: Any, decode: Any) -> Any:
    """Merge a `/v1/completions` response with echo and logprobs; returns `decode`."""
    p_choices = _choices_by_index(prefill)
    for index, choice in _choices_by_index(decode).items():
        p_choice = p_choices.get(index)
        if p_choice is not None and choice.get("logprobs") is not None:
            choice["logprobs"] = merge_choice_logprobs(p_choice.get("logprobs"), choice["logprobs"])
    return decode


def merge_body(kind: Merge, prefill_body: bytes, decode_body: bytes) -> bytes:
    """The merged decode body (JSON), or `decode_body` unchanged if either does not parse."""
    if kind is Merge.NONE:
        return decode_body
    try:
        prefill, decode = json.loads(prefill_body), json.loads(decode_body)
    except (ValueError, UnicodeDecodeError):
        return decode_body
    merged = merge_native(prefill, decode) if kind is Merge.NATIVE else merge_echo(prefill, decode)
    return json.dumps(merged, ensure_ascii=False).encode()


def sse_payloads(body: bytes) -> list[Any]:
    """The JSON payloads of an SSE body's `data:` events (`[DONE]` and bad JSON skipped)."""
    out: list[Any] = []
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            out.append(json.loads(data))
        except (ValueError, UnicodeDecodeError):
            continue
    return out


class StreamMerger:
    """Rewrites decode's stream events with the prompt logprobs of prefill's (whole) stream."""

    def __init__(self, kind: Merge, prefill_stream: bytes) -> None:
        self.kind = kind
        self._native: dict[int, dict[str, Any]] = {}
        self._echo: dict[int, dict[str, list[Any]]] = {}
        self._echo_done: set[int] = set()
        for payload in sse_payloads(prefill_stream):
            if kind is Merge.NATIVE:
                self._collect_native(payload)
            else:
                self._collect_echo(payload)

    def _collect_native(self, payload: Any) -> None:
        if not isinstance(payload, dict) or not isinstance(payload.get("meta_info"), dict):
            return
        index = payload.get("index", 0)
        slot = self._native.setdefault(index if isinstance(index, int) else 0, {})
        for key in INPUT_KEYS:
            value = payload["meta_info"].get(key)
            if isinstance(value, list) and value:
                slot[key] = value

    def _collect_echo(self, payload: Any) -> None:
        for index, choice in _choices_by_index(payload).items():
            lp = choice.get("logprobs")
            if not isinstance(lp, dict):
                continue
            slot = self._echo.setdefault(index, {key: [] for key in _COMPLETION_KEYS})
            for key in _COMPLETION_KEYS:
                if isinstance(lp.get(key), list):
                    slot[key].extend(lp[key])

    def event(self, data: bytes) -> bytes:
        """One decode event's data (without `data:`) -> the merged data."""
        try:
            payload = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return data
        if not isinstance(payload, dict):
            return data
        if self.kind is Merge.NATIVE:
            index = payload.get("index", 0)
            _merge_meta(self._native.get(index if isinstance(index, int) else 0), payload)
        else:
            for index, choice in _choices_by_index(payload).items():
                prefill_lp = self._echo.get(index)
                if index in self._echo_done or prefill_lp is None:
                    continue
                if choice.get("logprobs") is not None:
                    choice["logprobs"] = merge_choice_logprobs(prefill_lp, choice["logprobs"])
                    self._echo_done.add(index)
        return json.dumps(payload, ensure_ascii=False).encode()
