"""Prompt text of a requested token count, by the rule the sim engine counts with.

The sim counts a text as ``ceil(UTF-8 bytes / 4)`` tokens and a chat as its rendering
(``<|role|>\\n{content}\\n`` per message, then ``<|assistant|>\\n``), so a prompt of N tokens
is 4N bytes of ASCII words (`kit.byte_tokenizer`: the rule and the words, which the sim reads
too). Real tokenizers count these words differently (roughly one token per word); `pdkit bench`
compares the count the server reports (`usage.prompt_tokens`) with the one asked and reports
the drift.

Texts are deterministic: the same (seed, request) gives the same words. Shared prefixes come
first and are identical within a group; a trace's `hash_ids` become blocks of
`TRACE_BLOCK_TOKENS` tokens, identical wherever the same hash appears.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from kit.byte_tokenizer import BYTES_PER_TOKEN, WORDS, render_chat
from kit.perf.workload import TRACE_BLOCK_TOKENS

Api = Literal["chat", "completions"]
_EMPTY_CHAT = render_chat([{"role": "user", "content": ""}])
CHAT_OVERHEAD_TOKENS = len(_EMPTY_CHAT.encode()) // BYTES_PER_TOKEN
"""Tokens the chat rendering adds around the user's content (6 with the sim's template)."""


def words(tokens: int, rng: random.Random) -> str:
    """ASCII words of exactly `tokens` x 4 bytes (the last word cut to fit)."""
    size = tokens * BYTES_PER_TOKEN
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size].ljust(size, "x")


def block_text(block: int, tokens: int = TRACE_BLOCK_TOKENS) -> str:
    """The text of one trace block: the same for the same hash id."""
    return words(tokens, random.Random(f"block:{block}"))


@dataclass(frozen=True)
class PromptPlan:
    """How one request's prompt is made: `tokens` in all, of which the first `prefix` tokens
    are its group's shared prefix (`group`), or the trace blocks `hash_ids`."""

    tokens: int
    seed: int
    index: int
    group: int | None = None
    prefix: int = 0
    hash_ids: tuple[int, ...] = ()


def prompt_text(plan: PromptPlan, api: Api) -> str:
    """The text to send as the completion prompt or the chat's user message."""
    total = plan.tokens - (CHAT_OVERHEAD_TOKENS if api == "chat" else 0)
    total = max(1, total)
    parts: list[str] = []
    used = 0
    if plan.hash_ids:
        for block in plan.hash_ids:
            take = min(TRACE_BLOCK_TOKENS, total - used)
            if take <= 0:
                break
            parts.append(block_text(block)[: take * BYTES_PER_TOKEN])
            used += take
    elif plan.group is not None and plan.prefix:
        take = min(plan.prefix, total)
        parts.append(words(take, random.Random(f"prefix:{plan.seed}:{plan.group}")))
        used = take
    if used < total:
        parts.append(words(total - used, random.Random(f"prompt:{plan.seed}:{plan.index}")))
    return "".join(parts)


def request_body(
    api: Api, model: str, text: str, max_tokens: int, *, stream: bool, cache_details: bool = False
) -> dict[str, Any]:
    """The OpenAI-style body: exactly `max_tokens` out (`ignore_eos`, SGLang's extension),
    usage in the stream's last chunk; `cache_details` asks for SGLang's breakdown of the
    cached prompt tokens by source."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "ignore_eos": True}
    if cache_details:
        body["return_cached_tokens_details"] = True
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
