"""The router's prompt ids (kit/lb/tokenizer.py) against SGLang 0.5.23's own code, run without a
server: `OpenAIServingChat._process_messages` on the tokenizer and template SGLang loads
(tests/oracles/sglang_prompt_ids.py), for the corpus of tests/support/prompt_corpus.py on the
tiny model and on variants of its tokenizer config that take SGLang's other branches (a
tokenizer that adds BOS itself, a template that loops over content parts, chat_template.jinja,
jinja features). The real server's answers are checked in test_router_tokenizer_real.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kit.lb.tokenizer import ModelTokenizer
from tests.conftest import REPO
from tests.support.prompt_corpus import CHATS, TEXTS
from tests.support.real_sglang import sglang_python

ORACLE = REPO / "tests" / "oracles" / "sglang_prompt_ids.py"

# A tokenizer that adds BOS itself (transformers 5's Llama class; the generic one ignores
# add_bos_token) and a template that writes none: SGLang encodes the rendered
# chat without special tokens (its tokenizer adds some to ""), so the prompt has no BOS.
NO_BOS_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] "
    "| trim + eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Content parts kept as a list (SGLang's "openai" content format).
PARTS_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message.role }}|>"
    "{% if message.content is string %}{{ message.content }}{% else %}"
    "{% for part in message.content %}[{{ part.text }}]{% endfor %}{% endif %}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Jinja features templates use: namespace, loop controls, tojson, raise_exception, a system
# prompt hoisted out of the loop.
FEATURES_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages[0]['role'] == 'system' %}{% set ns.system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% endif -%}"
    "{{ bos_token }}<|system|>\n{{ ns.system or 'default system' }}{{ eos_token }}\n"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('roles must be user or assistant') }}{% endif %}"
    "{%- if message['content'] == '' %}{% continue %}{% endif %}\n"
    "<|{{ message['role'] }}|>\n{{ message['content'] | tojson }}{{ eos_token }}"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n<|assistant|>\n{% endif %}"
)


def variant(base, folder, *, config=None, jinja=None):
    shutil.copytree(base, folder)
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data.update(config or {})
    path.write_text(json.dumps(data))
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, real_model):
    root = tmp_path_factory.mktemp("oracle")
    base = real_model
    return {
        "tiny": base,
        "bos-by-tokenizer": variant(
            base,
            root / "bos",
            config={"tokenizer_class": "LlamaTokenizerFast", "chat_template": NO_BOS_TEMPLATE},
        ),
        "generic-add-bos": variant(base, root / "generic-bos", config={"add_bos_token": True}),
        "content-parts": variant(base, root / "parts", config={"chat_template": PARTS_TEMPLATE}),
        "jinja-file": variant(base, root / "jinja", jinja=FEATURES_TEMPLATE),
    }


@pytest.fixture(scope="module")
def sglang_ids(models) -> dict[str, dict]:
    """SGLang's ids for each model folder (by name), from one run of the oracle."""
    cases = json.dumps({"chats": CHATS, "texts": TEXTS})
    result = subprocess.run(
        [sglang_python(), str(ORACLE), *(str(m) for m in models.values())],
        input=cases,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    answers = [json.loads(line) for line in lines if line.startswith('{"model"')]
    by_folder = {answer.pop("model"): answer for answer in answers}
    return {name: by_folder[str(model)] for name, model in models.items()}


@pytest.mark.parametrize(
    "name", ["tiny", "bos-by-tokenizer", "generic-add-bos", "content-parts", "jinja-file"]
)
def test_prompt_ids_are_sglangs_own(models, sglang_ids, name):
    theirs = sglang_ids[name]
    tokenizer = ModelTokenizer.load(models[name])
    compared = 0
    for chat, expected in zip(CHATS, theirs["chats"], strict=True):
        mine = tokenizer.chat_ids(chat)
        if isinstance(expected, dict):  # SGLang refuses it (a template error): so does pdkit
            assert mine is None, (chat, expected)
            continue
        assert mine == expected, chat
        compared += 1
    assert compared >= len(CHATS) - 2
    assert [tokenizer.encode_text(t) for t in TEXTS] == theirs["texts"]
