"""OpenAI streams whose ids the router follows (kit/lb/openai_stream.py): the legs' bodies, the
chunks the client gets, and the continuation of a cut stream."""

from __future__ import annotations

import json

from kit.lb.openai_stream import IdStream
from kit.lb.protocol import CHAT, COMPLETIONS, parse_request
from kit.lb.tokenizer import ModelTokenizer
from tests.support.tokenizer_model import make_model

MESSAGES = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}]
PROMPT = [1, 2, 3, 4, 5, 6]


def _pd(path, body, ids=PROMPT):
    pd = parse_request(path, json.dumps(body).encode())
    pd.ids = list(ids)
    return pd


def _chunk(text, ids, finish=None, first=False):
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    choice["token_ids"] = ids
    if first:
        choice["prompt_token_ids"] = PROMPT
    body = {"id": "r1", "object": "text_completion", "created": 1, "model": "m"}
    return json.dumps({**body, "choices": [choice], "usage": None}).encode()


def _usage(prompt, completion):
    body = {"id": "r1", "object": "text_completion", "created": 1, "model": "m", "choices": []}
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion
    return json.dumps({**body, "usage": usage}).encode()


def _events(raw: bytes) -> list[dict]:
    return [json.loads(part) for part in raw.split(b"\n\ndata: ") if part != b":"]


def test_a_chat_stream_is_bridged_through_completions_with_every_sampling_field(tmp_path):
    folder = make_model(tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20}))
    tokenizer = ModelTokenizer.load(folder)
    body = {"model": "m", "messages": MESSAGES, "stream": True, "top_p": 0.9, "stop": ["\n\n"]}
    follow = IdStream.plan(_pd(CHAT, body), tokenizer, context_length=512)
    assert follow is not None and follow.wire.path == COMPLETIONS
    wire = follow.wire.body
    assert wire["prompt"] == PROMPT and wire["return_token_ids"] is True and wire["stream"]
    assert (wire["temperature"], wire["top_k"], wire["top_p"]) == (0.6, 20, 0.9)
    assert (wire["min_p"], wire["repetition_penalty"]) == (0.0, 1.0)
    assert wire["max_tokens"] == 512 - len(PROMPT)  # chat's unset budget: up to the context
    assert wire["stop"] == ["\n\n"] and "messages" not in wire
    assert IdStream.plan(_pd(CHAT, body), tokenizer, context_length=None) is None
    for extra in ({"tools": [{"type": "function"}]}, {"logprobs": True}, {"n": 2}):
        assert IdStream.plan(_pd(CHAT, {**body, **extra}), tokenizer, 512) is None
    assert IdStream.plan(_pd(CHAT, body, ids=[]), tokenizer, 512) is None
    unknown = parse_request(CHAT, json.dumps(body).encode())  # no ids: not followed
    assert IdStream.plan(unknown, tokenizer, 512) is None
    # --no-chat-bridge (workers with a reasoning or tool-call parser): chat goes to chat.
    assert IdStream.plan(_pd(CHAT, body), tokenizer, 512, bridge_chat=False) is None
    completions = {"prompt": "hi", "stream": True}
    assert IdStream.plan(_pd(COMPLETIONS, completions), tokenizer, 512, bridge_chat=False)


def test_a_completions_stream_asks_for_ids_and_the_client_does_not_see_them():
    body = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": 8}
    follow = IdStream.plan(_pd(COMPLETIONS, body), None, None)
    assert follow is not None and follow.wire.body["return_token_ids"] is True
    out = json.loads(follow.event(_chunk("a", [7], first=True)))
    assert "token_ids" not in out["choices"][0] and "prompt_token_ids" not in out["choices"][0]
    assert follow.ids == [7] and follow.text == "a"
    asked = IdStream.plan(_pd(COMPLETIONS, {**body, "return_token_ids": True}), None, None)
    assert asked is not None
    out = json.loads(asked.event(_chunk("a", [7], first=True)))
    assert out["choices"][0]["token_ids"] == [7]
    assert IdStream.plan(_pd(COMPLETIONS, {**body, "echo": True}), None, None) is None


def test_completions_chunks_become_chat_chunks():
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 8}
    follow = IdStream.plan(_pd(CHAT, body), None, None)
    assert follow is not None
    first = _events(follow.event(_chunk("Hel", [7], first=True)))
    assert [e["object"] for e in first] == ["chat.completion.chunk"] * 2
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first[1]["choices"][0]["delta"] == {"content": "Hel"}
    last = _events(follow.event(_chunk("lo", [8], finish="stop")))
    assert [e["choices"][0]["delta"] for e in last] == [{"content": "lo"}, {}]
    assert last[1]["choices"][0]["finish_reason"] == "stop"
    usage = _events(follow.event(_usage(6, 2)))
    assert usage[0]["choices"] == [] and usage[0]["usage"]["completion_tokens"] == 2


def test_a_bridged_chat_keeps_the_cached_tokens_by_source_it_asked_for():
    """return_cached_tokens_details goes to the completions leg too, and the sglext chunk
    (cached tokens by device, host, storage) comes back to the chat client (the KV pool's
    storage hits in `pdkit bench`'s records)."""
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 8}
    body["return_cached_tokens_details"] = True
    follow = IdStream.plan(_pd(CHAT, body), None, None)
    assert follow is not None and follow.wire.body["return_cached_tokens_details"] is True
    details = {"device": 0, "host": 0, "storage": 32, "storage_backend": "MooncakeStore"}
    head = {"id": "r1", "object": "text_completion", "created": 1, "model": "m"}
    chunk = json.dumps({**head, "choices": [], "sglext": {"cached_tokens_details": details}})
    (out,) = _events(follow.event(chunk.encode()))
    assert out["object"] == "chat.completion.chunk" and out["choices"] == []
    assert out["sglext"] == {"cached_tokens_details": details}


def test_a_cut_stream_continues_from_the_ids_sent_with_usage_as_unbroken():
    body = {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 8, "min_tokens": 3}
    follow = IdStream.plan(_pd(CHAT, body), None, None)
    assert follow is not None
    follow.event(_chunk("a", [7], first=True))
    follow.event(_chunk("b", [8]))
    following = follow.continuation()
    assert following is not None and following.path == COMPLETIONS
    assert following.body["prompt"] == [*PROMPT, 7, 8]
    assert (following.body["max_tokens"], following.body["min_tokens"]) == (6, 1)
    rejoin = follow.rejoin()
    events = _events(rejoin.event(_chunk("c", [9], first=True)))
    assert [e["choices"][0]["delta"] for e in events] == [{"content": "c"}]  # no second role
    usage = _events(rejoin.event(_usage(len(PROMPT) + 2, 1)))[0]["usage"]
    assert usage == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}


def test_the_text_of_a_character_cut_by_the_join_is_rebuilt_from_the_ids(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m"))
    ids = tokenizer.encode_text("the é")
    cut = len(ids) - 1  # the two bytes of é are two tokens: cut between them
    assert tokenizer.decode(ids[:cut]).endswith("\ufffd")
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 8}
    follow = IdStream.plan(_pd(COMPLETIONS, body), tokenizer, None)
    assert follow is not None
    follow.event(_chunk("the ", ids[:cut]))  # SGLang holds the incomplete character back
    rejoin = follow.rejoin()
    # the new decode cannot finish a character begun before its prompt's end
    out = json.loads(rejoin.event(_chunk("\ufffd", ids[cut:])))
    assert out["choices"][0]["text"] == "é" and follow.text == "the é"


def test_the_last_chunk_after_a_join_flushes_an_incomplete_character_as_sglang_does(tmp_path):
    """Seen on the real server (benchmarks/real_pd_faults.py): a stream that ends inside a
    character ends with U+FFFD unbroken; continued, its final chunk must give it too."""
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m"))
    ids = tokenizer.encode_text("the é")
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 8}
    follow = IdStream.plan(_pd(COMPLETIONS, body), tokenizer, None)
    assert follow is not None
    follow.event(_chunk("the", ids[:1]))
    rejoin = follow.rejoin()
    held = json.loads(rejoin.event(_chunk(" \ufffd", ids[1:-1])))
    assert held["choices"][0]["text"] == " "  # mid-stream: the incomplete byte held back
    last = json.loads(rejoin.event(_chunk("", [], finish="length")))
    assert last["choices"][0]["text"] == "\ufffd" and follow.text == "the \ufffd"


def test_a_stop_string_across_the_join_ends_the_stream():
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 8, "stop": ["END"]}
    follow = IdStream.plan(_pd(COMPLETIONS, body), None, None)
    assert follow is not None
    follow.event(_chunk("done E", [7, 8]))
    rejoin = follow.rejoin()
    out = json.loads(rejoin.event(_chunk("ND more", [9])))
    choice = out["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["matched_stop"]) == ("", "stop", "END")
    assert rejoin.event(_chunk(" ignored", [10])) == b":"  # the new decode's rest is dropped
    usage = json.loads(rejoin.event(_usage(len(PROMPT) + 2, 5)))["usage"]
    assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] == len(PROMPT)


def test_a_stream_whose_chunks_carry_no_ids_is_not_continued():
    body = {"model": "m", "prompt": "x", "stream": True, "max_tokens": 8}
    follow = IdStream.plan(_pd(COMPLETIONS, body), None, None)
    assert follow is not None
    chunk = json.loads(_chunk("a", [7]))
    del chunk["choices"][0]["token_ids"]
    follow.event(json.dumps(chunk).encode())
    assert not follow.exact
