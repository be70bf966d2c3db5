"""The PD protocol as pure functions: request checks, bootstrap fields, logprob merging."""

from __future__ import annotations

import json
import random

import pytest

from kit.lb.config import WorkerSpec
from kit.lb.errors import ApiError
from kit.lb.logprobs import StreamMerger, merge_body, merge_choice_logprobs, merge_native
from kit.lb.protocol import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    ROOM_SPAN,
    Merge,
    affinity_key,
    parse_request,
)


def encode(path: str, body: dict | bytes, host: str = "10.0.0.1", port: int | None = 8998):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = parse_request(path, raw)
    body, room = req.encode(host, port, random.Random(1))
    out = json.loads(body)
    rooms = out["bootstrap_room"]
    assert room == (rooms[0] if isinstance(rooms, list) else rooms)
    return req, out


def test_single_request_gets_scalar_bootstrap_fields_and_keeps_every_field():
    req, out = encode(GENERATE, {"text": "héllo", "sampling_params": {"max_new_tokens": 3}})
    assert req.spliceable and req.batch_size is None
    assert out["text"] == "héllo" and out["sampling_params"] == {"max_new_tokens": 3}
    assert out["bootstrap_host"] == "10.0.0.1" and out["bootstrap_port"] == 8998
    assert isinstance(out["bootstrap_room"], int) and 0 <= out["bootstrap_room"] < ROOM_SPAN


def test_batches_get_lists_of_the_batch_size_with_distinct_rooms():
    _, out = encode(GENERATE, {"text": ["a", "b", "c"]}, port=None)
    assert out["bootstrap_host"] == ["10.0.0.1"] * 3
    assert out["bootstrap_port"] == [None] * 3
    assert len(set(out["bootstrap_room"])) == 3
    _, out = encode(GENERATE, {"input_ids": [[1, 2], [3]]})
    assert len(out["bootstrap_room"]) == 2
    _, out = encode(GENERATE, {"input_ids": [1, 2, 3]})
    assert isinstance(out["bootstrap_room"], int)


def test_openai_routes_always_get_scalar_fields_even_for_prompt_lists():
    _, out = encode(COMPLETIONS, {"prompt": ["a", "b"]})
    assert isinstance(out["bootstrap_room"], int)


def test_client_bootstrap_fields_are_replaced_not_duplicated():
    req, out = encode(GENERATE, {"text": "x", "bootstrap_room": 5, "bootstrap_host": "evil"})
    assert not req.spliceable
    assert out["bootstrap_host"] == "10.0.0.1" and out["bootstrap_room"] != 5


def test_every_encode_draws_new_rooms():
    req = parse_request(GENERATE, b'{"text": "x"}')
    rng = random.Random(3)
    encoded = [req.encode("h", 1, rng) for _ in range(20)]
    rooms = {json.loads(body)["bootstrap_room"] for body, _ in encoded}
    assert rooms == {room for _, room in encoded}
    assert len(rooms) == 20


def test_ipv6_bootstrap_host_is_bracketed():
    assert WorkerSpec("http://[fd00::1]:30000", "prefill", 8998).bootstrap_host == "[fd00::1]"
    assert WorkerSpec("http://node-1:30000", "prefill").bootstrap_host == "node-1"


def test_whitespace_around_the_body_is_fine():
    _, out = encode(GENERATE, b'  \n{"text": "x"}\n\n')
    assert out["text"] == "x" and "bootstrap_room" in out


@pytest.mark.parametrize(
    "raw",
    [
        b'{"text": "x", "a": NaN, "b": Infinity, "c": 1e400, "d": -1e400}',
        b'{"text": "\\ud800 and \\udc00x", "x": "\xed\xa0\x80"}',
        b'\xef\xbb\xbf{"text": "a BOM"}',
        '{"text": "utf-16"}'.encode("utf-16"),
        b'{"text": "x", "a": 1, "a": 2, "big": 123456789012345678901234567890, "z": -0.0}',
        b'{"text": "\\ud83d\\ude80 \\u00e9\\/\\b\\f\\n\\t \xc3\xa9\xf0\x9f\x9a\x80"}',
    ],
)
def test_the_body_is_what_json_loads_reads_lenient_json_included(raw):
    assert repr(parse_request(GENERATE, raw).body) == repr(json.loads(raw))


def test_random_bodies_read_as_json_loads_reads_them():
    rng = random.Random(3)

    def value(depth: int) -> object:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return rng.randint(-(2**70), 2**70)
        if kind == 1:
            return rng.random() * 10 ** rng.randint(-30, 30) * rng.choice((1, -1))
        if kind == 2:
            return "".join(
                chr(
                    rng.choice(
                        (
                            rng.randrange(0, 0xD800),
                            rng.randrange(0xE000, 0x110000),
                            rng.randrange(0, 128),
                        )
                    )
                )
                for _ in range(rng.randrange(12))
            )
        if kind == 3:
            return rng.choice((True, False, None))
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {str(value(depth + 1)): value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(500):
        body = {"text": "x", "v": value(0)}
        for ascii_only in (True, False):
            raw = json.dumps(body, ensure_ascii=ascii_only).encode()
            assert repr(parse_request(GENERATE, raw).body) == repr(json.loads(raw))


@pytest.mark.parametrize(
    ("path", "raw", "needle"),
    [
        (GENERATE, b"", "empty"),
        (GENERATE, b"{not json", "not valid JSON"),
        (GENERATE, b'{"text": "x",}', "Expecting property name enclosed in double quotes"),
        (GENERATE, b'{"text": "\xff"}', "not valid JSON"),
        (GENERATE, b"[1, 2]", "JSON object"),
        (GENERATE, b"{}", "needs 'text' or 'input_ids'"),
        (GENERATE, b'{"text": 5}', "'text'"),
        (GENERATE, b'{"text": []}', "'text'"),
        (GENERATE, b'{"input_ids": ["a"]}', "'input_ids'"),
        (GENERATE, b'{"text": "x", "stream": "yes"}', "'stream'"),
        (GENERATE, b'{"text": "x", "sampling_params": {"n": 0}}', "sampling_params.n"),
        (GENERATE, b'{"text": "x", "return_logprob": 3}', "return_logprob"),
        (COMPLETIONS, b'{"max_tokens": 3}', "'prompt'"),
        (COMPLETIONS, b'{"prompt": "x", "logprobs": "2"}', "'logprobs'"),
        (CHAT, b'{"messages": []}', "'messages'"),
        (CHAT, b'{"messages": ["hi"]}', "object"),
        (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "n": -1}', "'n'"),
    ],
)
def test_bad_bodies_are_400_with_a_message_naming_the_field(path, raw, needle):
    with pytest.raises(ApiError) as info:
        parse_request(path, raw)
    assert info.value.status == 400
    assert needle in info.value.message
    body = json.loads(info.value.body())
    assert body["error"]["code"] == 400 and body["error"]["type"] == "invalid_request_error"


def test_merge_kind_follows_what_the_client_asked():
    assert parse_request(GENERATE, b'{"text": "x", "return_logprob": true}').merge is Merge.NATIVE
    assert (
        parse_request(GENERATE, b'{"text": ["x"], "return_logprob": [false, true]}').merge
        is Merge.NATIVE
    )
    assert parse_request(COMPLETIONS, b'{"prompt": "x", "logprobs": 2}').merge is Merge.NONE
    assert (
        parse_request(COMPLETIONS, b'{"prompt": "x", "logprobs": 2, "echo": true}').merge
        is Merge.ECHO
    )
    chat = b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true}'
    assert parse_request(CHAT, chat).merge is Merge.NONE


def test_affinity_key_is_the_prompt_prefix():
    long_a = "system prompt " * 40
    r1 = parse_request(GENERATE, json.dumps({"text": long_a + "question one"}).encode())
    r2 = parse_request(GENERATE, json.dumps({"text": long_a + "question two"}).encode())
    assert affinity_key(r1, 256) == affinity_key(r2, 256)
    r3 = parse_request(GENERATE, json.dumps({"text": "other " + long_a}).encode())
    assert affinity_key(r1, 256) != affinity_key(r3, 256)
    ids = parse_request(GENERATE, json.dumps({"input_ids": list(range(100))}).encode())
    assert affinity_key(ids, 16) == b"ids:0,1,2,3"
    chat = parse_request(
        CHAT,
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                ]
            }
        ).encode(),
    )
    assert affinity_key(chat, 256) == b"system:be brief\nuser:hi\n"
    embeds = parse_request(GENERATE, b'{"input_embeds": [[0.1]]}')
    assert affinity_key(embeds, 256) is None


def test_native_merge_puts_prefill_input_logprobs_first_per_batch_item():
    prefill = [
        {
            "meta_info": {
                "input_token_logprobs": [[None, 1, None], [-0.5, 2, None]],
                "input_top_logprobs": [None, []],
            }
        },
        {"meta_info": {"input_token_logprobs": [[None, 9, None]]}},
    ]
    decode = [
        {"meta_info": {"input_token_logprobs": [], "output_token_logprobs": [[-1, 5, None]]}},
        {"meta_info": {"input_token_logprobs": []}},
    ]
    merged = merge_native(prefill, decode)
    assert merged[0]["meta_info"]["input_token_logprobs"] == [[None, 1, None], [-0.5, 2, None]]
    assert merged[0]["meta_info"]["input_top_logprobs"] == [None, []]
    assert merged[0]["meta_info"]["output_token_logprobs"] == [[-1, 5, None]]
    assert merged[1]["meta_info"]["input_token_logprobs"] == [[None, 9, None]]


def test_native_merge_does_not_count_prompt_logprobs_twice():
    prompt = [[None, 1, None], [-0.5, 2, None]]
    decode = {"meta_info": {"input_token_logprobs": list(prompt)}}
    merged = merge_native({"meta_info": {"input_token_logprobs": prompt}}, decode)
    assert merged["meta_info"]["input_token_logprobs"] == prompt
    missing = merge_native({"meta_info": {"input_token_logprobs": prompt}}, {"meta_info": {}})
    assert missing["meta_info"]["input_token_logprobs"] == prompt


def test_echo_merge_counts_the_shared_first_output_token_once():
    prefill = {
        "tokens": ["a", "b", " x"],
        "token_logprobs": [None, -0.2, -0.3],
        "text_offset": [-1] * 3,
        "top_logprobs": [{}, {}, {}],
    }
    decode = {
        "tokens": [" x", " y"],
        "token_logprobs": [-0.3, -0.4],
        "text_offset": [-1, -1],
        "top_logprobs": [{}, {}],
    }
    merged = merge_choice_logprobs(prefill, decode)
    assert merged["tokens"] == ["a", "b", " x", " y"]
    assert merged["token_logprobs"] == [None, -0.2, -0.3, -0.4]
    assert len(merged["top_logprobs"]) == 4
    # merging twice changes nothing
    assert merge_choice_logprobs(prefill, dict(merged))["tokens"] == merged["tokens"]


def test_unparseable_bodies_pass_through_unchanged():
    assert merge_body(Merge.NATIVE, b"oops", b'{"text": "ok"}') == b'{"text": "ok"}'
    assert merge_body(Merge.NONE, b"", b"raw") == b"raw"


def test_stream_merger_rewrites_every_decode_event_by_index():
    prefill = (
        b'data: {"index": 1, "meta_info": {"input_token_logprobs": [[null, 7, null]]}}\n\n'
        b'data: {"index": 0, "meta_info": {"input_token_logprobs": [[null, 3, null]]}}\n\n'
        b"data: [DONE]\n\n"
    )
    merger = StreamMerger(Merge.NATIVE, prefill)
    out = json.loads(merger.event(b'{"index": 1, "meta_info": {"input_token_logprobs": []}}'))
    assert out["meta_info"]["input_token_logprobs"] == [[None, 7, None]]
    out = json.loads(merger.event(b'{"meta_info": {"input_token_logprobs": []}}'))
    assert out["meta_info"]["input_token_logprobs"] == [[None, 3, None]]
    assert merger.event(b"not json") == b"not json"
