"""The router's tokenizer (kit/lb/tokenizer.py) against the real SGLang 0.5.23 on the CPU: for the
corpus of tests/support/prompt_corpus.py, the prompt ids pdkit computes are the server's own
(`return_prompt_token_ids` on chat, `return_token_ids` on completions, the count in `usage`);
the stream facts the router's migration relies on; and the crash the router's validation
prevents: an out-of-vocabulary id takes the whole server down (the last test: it kills the
session's server, real_sglang/conftest.py, which a later test asking for it gets anew)."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import pytest

from kit.lb.tokenizer import ModelTokenizer
from tests.support.prompt_corpus import CHATS, TEXTS
from tests.support.sim_launch import request_json

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def tokenizer(real_model):
    return ModelTokenizer.load(real_model)


@pytest.fixture
def server(colocated, tokenizer):
    """The session's plain real server of the tiny model (real_sglang/conftest.py; a new one
    after the last test killed it) and pdkit's tokenizer of that model."""
    return colocated, tokenizer


def _post(url: str, body: dict) -> tuple[int, dict]:
    status, answer = request_json(url, body=body, timeout_s=120)
    return status, answer


@pytest.mark.parametrize("index", range(len(CHATS)))
def test_chat_prompt_ids_are_sglangs(server, index):
    real, tokenizer = server
    body = {**CHATS[index], "max_tokens": 1, "return_prompt_token_ids": True}
    status, answer = _post(real.url + "/v1/chat/completions", body)
    assert status == 200, answer
    theirs = answer["choices"][0]["prompt_token_ids"]
    assert tokenizer.chat_ids(CHATS[index]) == theirs
    assert answer["usage"]["prompt_tokens"] == len(theirs)


@pytest.mark.parametrize("text", [t for t in TEXTS if t])
def test_text_prompt_ids_are_sglangs(server, text):
    real, tokenizer = server
    body = {"prompt": text, "max_tokens": 1, "return_token_ids": True}
    status, answer = _post(real.url + "/v1/completions", body)
    assert status == 200, answer
    assert tokenizer.prompt_ids("/v1/completions", body) == answer["choices"][0]["prompt_token_ids"]
    status, native = _post(
        real.url + "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 200, native
    assert native["meta_info"]["prompt_tokens"] == len(tokenizer.encode_text(text))


def _sse(url: str, body: dict) -> tuple[int, list[dict]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, [json.loads(exc.read() or b"{}")]
    events = [
        json.loads(line[len("data: ") :])
        for line in raw.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    return status, events


def test_completions_stream_carries_the_generated_ids(server):
    """serving_completions.py ~336-385: with return_token_ids each chunk carries its token_ids
    (the first the prompt's too), and they decode to the streamed text."""
    real, tokenizer = server
    body = {
        "prompt": "The quick brown fox",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    status, events = _sse(real.url + "/v1/completions", body)
    assert status == 200
    chunks = [e for e in events if e.get("choices")]
    ids = [i for e in chunks for i in (e["choices"][0].get("token_ids") or [])]
    assert len(ids) == 12
    assert chunks[0]["choices"][0]["prompt_token_ids"] == tokenizer.encode_text(body["prompt"])
    text = "".join(e["choices"][0]["text"] for e in chunks)
    assert tokenizer.decode(ids) == text


def test_chat_stream_refuses_return_token_ids(server):
    """serving_chat.py ~1313-1319: a chat stream cannot carry the generated ids."""
    real, _ = server
    body = {**CHATS[0], "max_tokens": 4, "stream": True, "return_token_ids": True}
    status, events = _sse(real.url + "/v1/chat/completions", body)
    assert status == 400
    assert "return_token_ids is not supported with streaming" in json.dumps(events)


GREEDY_OPENAI = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def test_a_chat_sent_as_completions_with_the_routers_ids_says_the_same(server):
    """The exact way to migrate a chat stream: the decode leg gets it as /v1/completions with
    the router's prompt ids (and return_token_ids); the text is the chat's own."""
    real, tokenizer = server
    chat = CHATS[2]
    status, answer = _post(real.url + "/v1/chat/completions", {**chat, **GREEDY_OPENAI})
    assert status == 200, answer
    body = {"prompt": tokenizer.chat_ids(chat), **GREEDY_OPENAI, "return_token_ids": True}
    status, completion = _post(real.url + "/v1/completions", body)
    assert status == 200, completion
    assert completion["choices"][0]["text"] == answer["choices"][0]["message"]["content"]
    assert completion["usage"] == answer["usage"]


def test_a_completions_stream_continued_from_its_ids_is_exact_and_its_text_is_rebuilt(server):
    """A stream cut after 5 tokens, continued on prompt + those ids: the same ids follow
    (greedy). Its text does not always join: a cut inside a character (bytes of one character
    in two tokens; the tiny model makes such splits often) loses that character, since the
    new decode starts from the prompt's tail, where it is incomplete. The router rebuilds the
    text from the ids with the model's tokenizer: the client gets decode(all ids) past what it
    was sent, which is the unbroken text."""
    real, tokenizer = server
    prompt = tokenizer.chat_ids(CHATS[1])
    stream = {"prompt": prompt, **GREEDY_OPENAI, "stream": True, "return_token_ids": True}
    status, events = _sse(real.url + "/v1/completions", stream)
    assert status == 200
    chunks = [e["choices"][0] for e in events if e.get("choices")]
    whole = "".join(c["text"] for c in chunks)
    ids = [i for c in chunks for i in (c.get("token_ids") or [])]
    sent, text_sent = [], ""
    for c in chunks:
        if len(sent) >= 5:
            break
        sent += c.get("token_ids") or []
        text_sent += c["text"]
    rest = {
        "prompt": prompt + sent,
        **GREEDY_OPENAI,
        "max_tokens": GREEDY_OPENAI["max_tokens"] - len(sent),
        "return_token_ids": True,
    }
    status, answer = _post(real.url + "/v1/completions", rest)
    assert status == 200, answer
    assert sent + answer["choices"][0]["token_ids"] == ids
    rebuilt = tokenizer.decode(ids)
    assert rebuilt.startswith(text_sent)
    assert text_sent + rebuilt[len(text_sent) :] == whole


def test_an_out_of_vocabulary_id_kills_the_server(server):
    """What the router's validation prevents: SGLang 0.5.23 checks no input id against the
    vocabulary, and the embedding's IndexError takes the whole server down. Last: it kills it."""
    real, _ = server
    # The id: far past the vocabulary. An id just past it may land in the embedding's
    # padding (SGLang pads the vocabulary: 562 rows become 576 here) and only gives garbage.
    oov = 999_999_999
    with contextlib.suppress(OSError):  # the connection may die with the server
        request_json(
            real.url + "/generate",
            body={"input_ids": [1, 2, oov], "sampling_params": {"max_new_tokens": 2}},
            timeout_s=60,
        )
    deadline = time.monotonic() + 60
    while real.alive() and time.monotonic() < deadline:
        time.sleep(1)
    assert not real.alive(), "the server survived an out-of-vocabulary id"
    print(real.log()[-2000:])
