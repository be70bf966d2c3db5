"""Prompts whose ids pdkit's router must compute exactly as SGLang 0.5.23 does: multi-turn chats
with system prompts, unicode, a long document, content parts, the final-assistant rules, and
completions/generate texts. Each chat is a /v1/chat/completions body without sampling fields."""

from __future__ import annotations

from typing import Any

SYSTEM = "You are a helpful assistant. Answer briefly and cite the document where you can."
DOCUMENT = " ".join(
    f"Section {i}: Prefill and decode run on separate servers; the KV cache of {i * 37} tokens "
    f"moves between them over TCP, and the router picks the pair (naïve café, 東京, ü {i})."
    for i in range(18)
)
"""About 2,700 characters (1,300 tokens of the tiny model): a long document, still inside the
tiny model's 2,048 positions."""

CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello world"}]},
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]},
    {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
            {"role": "user", "content": "And of Japan? Answer in 日本語, please 🙏."},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Summarise this document:\n\n" + DOCUMENT},
        ]
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
            }
        ]
    },
    # A final assistant message becomes a user one (serving_chat.py _handle_last_assistant_message).
    {
        "messages": [
            {"role": "user", "content": "Write"},
            {"role": "assistant", "content": "a poem"},
        ]
    },
    # ... or is continued, its text appended to the ids without a BOS.
    {
        "messages": [
            {"role": "user", "content": "Write"},
            {"role": "assistant", "content": "The sea"},
        ],
        "continue_final_message": True,
    },
    {"messages": [{"role": "user", "content": ""}]},
    {"messages": [{"role": "user", "content": "  leading and trailing spaces \n\t"}]},
    {"messages": [{"role": "user", "content": "<s> and </s> written by a user, <|user|> too"}]},
    {
        "messages": [
            {"role": "system", "content": "sys", "name": "ops"},
            {"role": "user", "content": "x"},
        ]
    },
    {
        "messages": [{"role": "user", "content": "kwargs"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
]

TEXTS: list[str] = [
    "The quick brown fox",
    "",
    " ",
    "héllo wörld 日本 🚀 ∑ ∫ \u200b zero-width",
    "<s>special tokens in text</s>",
    DOCUMENT,
]
"""/generate `text` and /v1/completions `prompt` strings."""
