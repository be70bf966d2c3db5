"""The router's tokenizer: loading as transformers 5 loads, the chat as SGLang 0.5.23 renders and
encodes it (the real server's ids are checked in
tests/e2e/real_sglang/test_router_tokenizer_real.py)."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from kit.lb.segments import HEAD_CHARS, SegmentCache, cut_points
from kit.lb.tokenizer import ModelTokenizer, TokenizerError, content_format
from tests.support.prompt_corpus import CHATS, TEXTS
from tests.support.tokenizer_model import LLAMA3_SPLIT, TEMPLATE, make_model


@pytest.fixture
def tokenizer(tmp_path):
    return ModelTokenizer.load(make_model(tmp_path / "m"))


def test_the_chat_is_rendered_with_the_generation_prompt_and_special_tokens(tokenizer):
    body = {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    }
    text = tokenizer.render_chat(tokenizer._messages(body["messages"]))
    assert text == "<s><|system|>\nbe brief</s>\n<|user|>\nhi</s>\n<|assistant|>\n"
    ids = tokenizer.chat_ids(body)
    assert ids[0] == tokenizer.bos_token_id  # from the template, once
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_a_final_assistant_message_becomes_a_user_one(tokenizer):
    as_user = tokenizer.chat_ids(
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    )
    last = tokenizer.chat_ids(
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    )
    assert last == as_user


def test_continue_final_message_appends_the_text_without_bos(tmp_path):
    tokenizer = ModelTokenizer.load(
        make_model(tmp_path / "m", config_extra={"tokenizer_class": "LlamaTokenizerFast"})
    )
    head = tokenizer.chat_ids({"messages": [{"role": "user", "content": "a"}]})
    body = {
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "the fox"}],
        "continue_final_message": True,
    }
    ids = tokenizer.chat_ids(body)
    tail = tokenizer.encode_text("the fox")
    assert tail[0] == tokenizer.bos_token_id
    assert ids == head + tail[1:]


def test_the_llama_class_adds_bos_and_the_chat_is_encoded_without_a_second(tmp_path):
    tokenizer = ModelTokenizer.load(
        make_model(tmp_path / "m", config_extra={"tokenizer_class": "LlamaTokenizerFast"})
    )
    assert tokenizer.encode_text("the fox")[0] == tokenizer.bos_token_id
    ids = tokenizer.chat_ids({"messages": [{"role": "user", "content": "x"}]})
    # The template writes <s>; encoding the rendered text adds no second one.
    assert ids.count(tokenizer.bos_token_id) == 1


def test_content_parts_are_joined_by_spaces_for_a_string_template(tokenizer):
    parts = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    }
    assert tokenizer.chat_ids(parts) == tokenizer.chat_ids(
        {"messages": [{"role": "user", "content": "a b"}]}
    )


def test_content_format_follows_the_template_loops():
    assert content_format(TEMPLATE) == "string"
    assert (
        content_format(
            "{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}"
        )
        == "openai"
    )
    assert (
        content_format(
            "{% for message in messages %}{% for p in message['content'] %}{% endfor %}{% endfor %}"
        )
        == "openai"
    )
    assert content_format("{{ image }}") == "openai"


@pytest.mark.parametrize(
    "body",
    [
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        {"messages": [{"role": "user", "content": "x"}], "input_ids": [1, 2]},
        {"messages": []},
        {"messages": "not a list"},
    ],
)
def test_shapes_not_reproduced_get_no_ids(tokenizer, body):
    assert tokenizer.chat_ids(body) is None


def test_a_user_name_is_dropped_as_sglang_drops_it(tmp_path):
    template = "{% for m in messages %}{{ m.get('name', '-') }}:{{ m.content }}{% endfor %}"
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", template=template))
    messages = [
        {"role": "system", "content": "s", "name": "ops"},
        {"role": "user", "content": "u", "name": "bob"},
    ]
    assert tokenizer.render_chat(tokenizer._messages(messages)) == "ops:s-:u"


def test_a_template_error_gives_no_ids(tmp_path):
    template = "{{ raise_exception('no system role') }}"
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", template=template))
    assert tokenizer.chat_ids({"messages": [{"role": "user", "content": "x"}]}) is None


def test_tojson_keeps_unicode_and_html(tmp_path):
    template = "{{ messages[0].content | tojson }}"
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", template=template))
    assert tokenizer.render_chat([{"role": "user", "content": "<é>"}]) == '"<é>"'


def test_prompt_ids_per_endpoint(tokenizer):
    ids = tokenizer.encode_text("the fox")
    assert tokenizer.prompt_ids("/generate", {"text": "the fox"}) == ids
    assert tokenizer.prompt_ids("/generate", {"input_ids": [5, 6]}) == [5, 6]
    assert tokenizer.prompt_ids("/v1/completions", {"prompt": "the fox"}) == ids
    assert tokenizer.prompt_ids("/v1/completions", {"prompt": ["the fox"]}) == ids
    assert tokenizer.prompt_ids("/v1/completions", {"prompt": [7, 8]}) == [7, 8]
    assert tokenizer.prompt_ids("/v1/completions", {"prompt": ["a", "b"]}) is None  # a batch
    assert tokenizer.prompt_ids("/generate", {"text": ["a", "b"]}) is None
    assert tokenizer.prompt_ids("/v1/embeddings", {"input": "x"}) is None


def test_limits_come_from_config_json(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", vocab_size=1024))
    assert tokenizer.limits.vocab_size == 1024
    assert tokenizer.limits.max_position_embeddings == 512


def test_a_missing_tokenizer_is_named(tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: no such file"):
        ModelTokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizer"):
        ModelTokenizer.load(tmp_path)


def test_no_template_gives_no_chat_ids(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", template=None))
    assert tokenizer.chat_ids({"messages": [{"role": "user", "content": "x"}]}) is None
    assert tokenizer.encode_text("the") != []


def test_chat_template_jinja_file_wins(tmp_path):
    folder = make_model(tmp_path / "m")
    (folder / "chat_template.jinja").write_text("FILE{{ messages[0].content }}")
    assert ModelTokenizer.load(folder).chat_template == "FILE{{ messages[0].content }}"


def test_the_corpus_is_covered(tokenizer):
    """Every chat of the shared corpus gets ids here (the e2e test compares them with SGLang's)."""
    assert all(tokenizer.chat_ids(chat) for chat in CHATS if chat["messages"][0]["content"])
    assert all(isinstance(tokenizer.encode_text(t), list) for t in TEXTS)


def test_the_generic_class_ignores_add_bos_token(tmp_path):
    """As transformers 5.19 does for PreTrainedTokenizerFast (measured in SGLang's venv)."""
    folder = make_model(tmp_path / "m", config_extra={"add_bos_token": True})
    tokenizer = ModelTokenizer.load(folder)
    assert tokenizer.bos_token_id not in tokenizer.encode_text("the fox")
    assert tokenizer.verified


def test_llama_without_add_bos_token_adds_none(tmp_path):
    extra = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False}
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m", config_extra=extra))
    assert tokenizer.bos_token_id not in tokenizer.encode_text("the fox")


def test_an_unknown_class_is_loaded_unverified(tmp_path):
    extra = {"tokenizer_class": "Qwen2TokenizerFast"}
    assert not ModelTokenizer.load(make_model(tmp_path / "m", config_extra=extra)).verified


def test_the_segment_cache_gives_the_whole_texts_ids(tokenizer):
    """Cut at added tokens, encoded piece by piece: the same ids as the whole text."""
    rng = random.Random(0)
    alphabet = [*"ab c\n\t<>|/s", "<s>", "</s>", "<|user|>", "<|", "|>", "é", "日", "🚀", "  "]
    segments = tokenizer._segments
    assert segments is not None
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        whole = tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
        assert segments.encode(text) == whole, text
    assert segments.encode("the fox</s>the fox") == segments.encode("the fox</s>the fox")


def test_a_repeated_system_prompt_is_encoded_once(tokenizer):
    system = {"role": "system", "content": "the quick brown fox " * 50}
    tokenizer.chat_ids({"messages": [system, {"role": "user", "content": "a"}]})
    cached = len(tokenizer._segments._cache)
    tokenizer.chat_ids({"messages": [system, {"role": "user", "content": "b"}]})
    assert len(tokenizer._segments._cache) == cached + 1  # only the new turn's piece


def test_no_segment_cache_where_the_cut_could_change_ids(tmp_path):
    folder = make_model(tmp_path / "m")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(folder / "tokenizer.json"))
    assert ModelTokenizer.load(folder)._segments is None


def _llama3_style(folder):
    """make_model's folder with Llama 3's pre-tokenizer: its Split regex, then ByteLevel."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.mark.parametrize("kind", ["byte_level", "llama_bos", "llama3_split"])
def test_a_long_text_is_cut_where_no_id_changes_and_a_shared_prefix_is_encoded_once(tmp_path, kind):
    """Texts past 2 x CUT_CHARS are cut before a space that follows a letter (a pre-token
    boundary for these pre-tokenizers): the ids are the whole text's, special tokens included,
    and a prefix seen before comes from the cache."""
    folder = make_model(tmp_path / "m")
    if kind == "llama_bos":
        folder = make_model(tmp_path / "b", config_extra={"tokenizer_class": "LlamaTokenizerFast"})
    elif kind == "llama3_split":
        folder = _llama3_style(folder)
    tokenizer = ModelTokenizer.load(folder)
    assert tokenizer._segments is not None and tokenizer._segments.cuts
    rng = random.Random(4)
    alphabet = [*"abc xyz  \n\t.,'!0123", "é", "日本", "🚀", "'s", " the", "\r\n", "</s>", "  "]
    for _ in range(60):
        shared = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 1500)))
        for _ in range(2):
            text = shared + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 600)))
            whole = tokenizer._tokenizer.encode(text, add_special_tokens=True).ids
            assert tokenizer.encode_text(text) == whole, text
    document = "the quick brown fox jumps over the lazy dog " * 100
    tokenizer.encode_text(document + "first question")
    cached = dict(tokenizer._segments._cache)
    text = document + "second question"
    tokenizer.encode_text(text)
    new = [span for span in tokenizer._segments._cache if span not in cached]
    assert len(new) == 1 and new[0].endswith("second question")  # only the last span
    # The same text again: the recent long piece with its first characters, whole.
    recent = tokenizer._segments._recent[text[:HEAD_CHARS]]
    assert recent.piece == text and recent.shared_spans(document + "first question") > 0
    assert tokenizer.encode_text(text) == tokenizer._tokenizer.encode(text).ids


@pytest.mark.parametrize("kind", ["byte_level", "llama3_split"])
def test_texts_that_share_a_prefix_with_the_last_long_one_get_the_whole_texts_ids(tmp_path, kind):
    """The spans a long text shares with the last one of its first characters come from it:
    prefixes ending before, at and after each cut, texts shorter and longer than it, and a text
    that differs inside its first span all get the whole text's ids."""
    folder = make_model(tmp_path / "m")
    if kind == "llama3_split":
        folder = _llama3_style(folder)
    tokenizer = ModelTokenizer.load(folder)
    rng = random.Random(5)
    # "fo", "th", "qui": word starts that a tail ("x", "e", "ck") makes one word with other ids
    words = ["the", "fox", "fo", "th", "qui", "日本", "é", "12", "'s", ".", "!!", "\n", "  ", "🚀"]
    base = " ".join(rng.choice(words) for _ in range(900))
    cuts = cut_points(base)[1:-1]
    assert len(cuts) > 4
    ends = [c + d for c in cuts for d in (-1, 0, 1)] + [300, len(base) - 5, len(base)]
    joined = 0  # texts whose ids would be wrong if a cut were reused without its space
    for end in ends:
        for tail in ("", "x the end", "e", "ck it", " " + base[:700]):
            tokenizer.encode_text(base)  # the last long text with these first characters
            text = base[:end] + tail
            whole = tokenizer._tokenizer.encode(text).ids
            assert tokenizer.encode_text(text) == whole, (end, tail)
            bare = tokenizer._tokenizer.encode(base[:end], add_special_tokens=False).ids
            joined += end in cuts and whole[: len(bare)] != bare
            early = text[:400] + "!" + text[401:]  # the same head, differing in the first span
            assert tokenizer.encode_text(early) == tokenizer._tokenizer.encode(early).ids
    assert joined > 0


def test_added_tokens_of_several_first_characters_are_found_as_the_tokenizer_finds_them(
    tmp_path,
):
    """The scan for added tokens jumps to their first character when they share one; with
    "[INST]" beside "<s>" it is the regular expression's: the same ids either way."""
    tok = Tokenizer.from_file(str(make_model(tmp_path / "m") / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("[INST]", special=True, normalized=False)])
    segments = SegmentCache.for_tokenizer(tok)
    assert segments is not None and segments._first is None
    rng = random.Random(1)
    alphabet = [*"ab c\n<>[]|/s", "<s>", "</s>", "[INST]", "[INST", "<|user|>", "é", "  "]
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert segments.encode(text) == tok.encode(text, add_special_tokens=False).ids, text


def test_no_cuts_for_a_pre_tokenizer_not_known_to_allow_them(tmp_path):
    folder = make_model(tmp_path / "m")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\w+|\s"), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.save(str(folder / "tokenizer.json"))
    segments = ModelTokenizer.load(folder)._segments
    assert segments is not None and not segments.cuts


def test_an_id_past_a_hole_in_the_vocabulary_is_encoded(tmp_path):
    """Cached ids are the vocabulary's shared ints up to the largest id, not up to the count of
    ids: a vocabulary may leave holes."""
    folder = make_model(tmp_path / "m")
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    fox = Tokenizer.from_file(str(path)).encode(" fox", add_special_tokens=False).ids
    assert len(fox) == 1
    far = max(vocab.values()) + 1000
    (name,) = [k for k, v in vocab.items() if v == fox[0]]
    vocab[name] = far
    path.write_text(json.dumps(spec))
    tokenizer = ModelTokenizer.load(folder)
    assert tokenizer._tokenizer.get_vocab_size(with_added_tokens=True) < far
    text = "the fox</s>the fox " * 3
    assert far in tokenizer.encode_text(text)
    assert tokenizer.encode_text(text) == tokenizer._tokenizer.encode(text).ids
