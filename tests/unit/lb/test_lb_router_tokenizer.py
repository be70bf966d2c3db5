"""The model tokenizer in the router (`--prompt-tokens model:PATH`): cache_aware's ids for text,
and what the router says at start-up when it has or lacks one."""

from __future__ import annotations

import json
import logging

import pytest

from kit.errors import TopologyError
from kit.lb.cache_aware import prompt_ids
from kit.lb.config import parse_args
from kit.lb.protocol import parse_request
from kit.lb.server import LoadBalancer
from kit.lb.tokenizer import ModelTokenizer, load_for_router
from kit.plan.resolve import resolve
from kit.topology.router_options import RouterOptions, model_tokenizer_path, option_problems
from tests.conftest import base_topology
from tests.support.lb_cluster import run, running_cluster
from tests.support.tokenizer_model import make_model

CHAT = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}


def test_cache_aware_hashes_the_models_ids_for_a_chat(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m"))
    pd = parse_request("/v1/chat/completions", json.dumps(CHAT).encode())
    assert prompt_ids(pd, None, tokenizer) == tokenizer.chat_ids(CHAT)
    # Without the model's tokenizer the router knows no ids for chat text (prefix_affinity).
    assert prompt_ids(pd, None) is None


def test_cache_aware_text_prompts_and_sent_ids(tmp_path):
    tokenizer = ModelTokenizer.load(make_model(tmp_path / "m"))
    text = parse_request("/v1/completions", json.dumps({"prompt": "the fox"}).encode())
    assert prompt_ids(text, None, tokenizer) == tokenizer.encode_text("the fox")
    ids = parse_request("/generate", json.dumps({"input_ids": [5, 6, 7]}).encode())
    assert prompt_ids(ids, None, tokenizer) == [5, 6, 7]


def test_the_start_up_line_says_what_the_router_has(tmp_path):
    tokenizer, note = load_for_router(str(make_model(tmp_path / "m")))
    assert tokenizer is not None
    assert "with its chat template" in note
    assert "text prompts get their token ids here" in note
    missing, note = load_for_router(str(tmp_path / "nowhere"))
    assert missing is None
    assert "tokenizer.json: no such file" in note
    assert "routed by prefix_affinity" in note
    none, note = load_for_router(None)
    assert none is None and note.startswith("no model tokenizer")


def test_prompt_tokens_takes_a_model_folder():
    assert model_tokenizer_path("model:/srv/models/llama") == "/srv/models/llama"
    assert model_tokenizer_path("sim:512") is None
    assert option_problems(RouterOptions(prompt_tokens="model:/srv/m")) == []
    problems = option_problems(RouterOptions(prompt_tokens="model:"))
    assert any("expected model:PATH" in p for p in problems)


def test_the_router_loads_it_and_says_so_once(tmp_path, caplog):
    folder = make_model(tmp_path / "m")
    argv = ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]
    argv += ["--prefill-policy", "cache_aware", "--prompt-tokens", f"model:{folder}"]
    with caplog.at_level(logging.INFO, logger="kit.lb"):
        lb = LoadBalancer(parse_args(argv, {}))
    assert lb.cache_aware is not None and lb.cache_aware.tokenizer is lb.tokenizer
    assert lb.tokenizer is not None
    lines = [r.getMessage() for r in caplog.records if "model tokenizer" in r.getMessage()]
    assert len(lines) == 1 and str(folder) in lines[0]
    argv[-1] = f"model:{tmp_path / 'missing'}"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kit.lb"):
        lb = LoadBalancer(parse_args(argv, {}))
    assert lb.tokenizer is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no model tokenizer" in r.getMessage() for r in warnings)


def test_the_plan_gives_pdkits_router_the_served_models_folder(write_topology, tmp_path):
    data = base_topology()
    data["model"] = {"path": str(tmp_path / "model")}
    args = resolve(write_topology(data, "a.yaml")).router.command.args
    assert f"model:{tmp_path / 'model'}" in args
    assert parse_args(list(args), environ={}).prompt_tokens == f"model:{tmp_path / 'model'}"
    # A Hugging Face repo id (no folder on the router's host): none.
    data["model"] = {"path": "meta-llama/Llama-3.1-8B-Instruct"}
    assert "--prompt-tokens" not in resolve(write_topology(data, "b.yaml")).router.command.args
    # Emulated workers: their tokenizer, the vocabulary asked of them (a folder or not).
    for path in (str(tmp_path / "model"), "meta-llama/Llama-3.1-8B-Instruct"):
        data["model"] = {"path": path}
        data["engine"] = "sim"
        args = resolve(write_topology(data, "c.yaml")).router.command.args
        assert parse_args(list(args), environ={}).prompt_tokens == "sim"


def test_workers_that_parse_chat_output_get_a_router_that_does_not_bridge_chats(write_topology):
    """SGLang's --reasoning-parser and --tool-call-parser act on /v1/chat/completions only: a
    chat bridged through /v1/completions would come back with them unparsed."""
    data = base_topology()
    assert "--no-chat-bridge" not in resolve(write_topology(data, "a.yaml")).router.command.args
    data["prefill"]["args"] = {"reasoning-parser": "deepseek-r1"}
    data["decode"]["args"] = {"reasoning-parser": "deepseek-r1"}
    args = resolve(write_topology(data, "b.yaml")).router.command.args
    assert "--no-chat-bridge" in args
    assert parse_args(list(args), environ={}).chat_bridge is False
    data["router"]["args"] = {"chat-bridge": True}
    with pytest.raises(TopologyError, match=r"reasoning-parser.*without its reasoning") as err:
        resolve(write_topology(data, "c.yaml"))
    assert "remove chat-bridge from router.args" in str(err.value)


def test_prompt_tokens_sim_asks_the_workers_for_the_emulated_models_vocabulary():
    """`--prompt-tokens sim` (what the Plan gives pdkit's router in front of emulated workers):
    the vocabulary comes from the first worker whose /server_info says it; from then on the
    router knows a prompt's ids (an id outside the vocabulary is refused before any worker)."""
    assert option_problems(RouterOptions(prompt_tokens="sim")) == []

    async def scenario():
        args = ["--prompt-tokens", "sim"]
        async with running_cluster(1, 1, args=args) as c:
            assert c.lb.vocab_size is None  # no worker said it yet
            outside = {"input_ids": [1, 600], "sampling_params": {"max_new_tokens": 2}}
            status, _, _ = await c.post("/generate", outside)
            assert status == 200  # unknown vocabulary: left to the workers, as before
            c.decode[0].sim_vocab = 512
            await c.wait_for(lambda: c.lb.vocab_size == 512, timeout=5, what="the vocabulary")
            status, body, _ = await c.post("/generate", outside)
            assert status == 400, body

    run(scenario())
