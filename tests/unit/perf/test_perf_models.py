"""Model shapes: parameter and KV counts, where a shape comes from, and bad configs."""

from __future__ import annotations

import json
import logging
import os

import pytest

from kit.perf.hfcache import hub_cache_dir
from kit.perf.models import ModelConfigError, resolve_model, shipped_models

# Hand counts from each config.json (weights of attention, MLP/experts, routers, embeddings;
# norms and biases left out, as the model does). GQA attention per layer:
# 2 x hidden x heads x head_dim (Q, O) + 2 x hidden x kv_heads x head_dim (K, V).
# A SwiGLU MLP or expert: 3 x hidden x intermediate. Untied: embedding + LM head.
LLAMA_31_8B = {  # hidden 4096, 32 layers, 32 heads, 8 KV heads, 14336, vocab 128256
    "total": 32 * (2 * 4096 * 4096 + 2 * 4096 * 8 * 128 + 3 * 4096 * 14336) + 2 * 128256 * 4096,
    "kv_bytes": 2 * 32 * 8 * 128 * 2,  # K and V x layers x KV heads x head_dim x 2 bytes
}
LLAMA_2_13B = {  # hidden 5120, 40 layers, 40 heads (MHA), 13824, vocab 32000
    "total": 40 * (4 * 5120 * 5120 + 3 * 5120 * 13824) + 2 * 32000 * 5120,
    "kv_bytes": 2 * 40 * 40 * 128 * 2,
}
QWEN3_32B = {  # hidden 5120, 64 layers, 64 heads x 128, 8 KV heads, 25600, vocab 151936
    "total": 64 * (2 * 5120 * 64 * 128 + 2 * 5120 * 8 * 128 + 3 * 5120 * 25600) + 2 * 151936 * 5120,
    "kv_bytes": 2 * 64 * 8 * 128 * 2,
}
# Mixtral: hidden 4096, 32 layers, 32 heads, 8 KV heads; 8 experts of 14336, 2 per token;
# a router of hidden x 8 per layer; vocab 32000.
_MIXTRAL_ATTN = 2 * 4096 * 4096 + 2 * 4096 * 8 * 128
_MIXTRAL_EXPERT = 3 * 4096 * 14336
MIXTRAL_8X7B = {
    "total": 32 * (_MIXTRAL_ATTN + 8 * _MIXTRAL_EXPERT + 4096 * 8) + 2 * 32000 * 4096,
    "active": 32 * (_MIXTRAL_ATTN + 2 * _MIXTRAL_EXPERT + 4096 * 8) + 2 * 32000 * 4096,
    "kv_bytes": 2 * 32 * 8 * 128 * 2,
}
# DeepSeek-V3: hidden 7168, 61 layers, 128 heads, MLA (q_lora 1536, kv_lora 512, nope 128,
# rope 64, v 128); layers 0-2 dense (18432), 58 MoE layers of 256 routed experts (2048) with
# 8 per token, one shared expert and a router; vocab 129280.
_DSV3_ATTN = (
    7168 * 1536  # Q down
    + 1536 * 128 * (128 + 64)  # Q up
    + 7168 * (512 + 64)  # KV down plus the RoPE key
    + 512 * 128 * (128 + 128)  # K (nope) and V up
    + 128 * 128 * 7168  # O
)
_DSV3_EXPERT = 3 * 7168 * 2048
_DSV3_ALWAYS = (
    61 * _DSV3_ATTN + 3 * 3 * 7168 * 18432 + 58 * (_DSV3_EXPERT + 7168 * 256) + 2 * 129280 * 7168
)
DEEPSEEK_V3 = {
    "total": _DSV3_ALWAYS + 58 * 256 * _DSV3_EXPERT,
    "active": _DSV3_ALWAYS + 58 * 8 * _DSV3_EXPERT,
    "kv_bytes": 61 * (512 + 64) * 2,  # layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes
}


@pytest.mark.parametrize(
    "name, counts",
    [
        ("meta-llama/Llama-3.1-8B", LLAMA_31_8B),
        ("meta-llama/Llama-2-13b-hf", LLAMA_2_13B),
        ("Qwen/Qwen3-32B", QWEN3_32B),
        ("mistralai/Mixtral-8x7B-v0.1", MIXTRAL_8X7B),
        ("deepseek-ai/DeepSeek-V3", DEEPSEEK_V3),
    ],
)
def test_parameters_and_kv_bytes_match_hand_counts(name, counts):
    shape = resolve_model(name)
    assert shape.total_params() == counts["total"]
    assert shape.active_params() == counts.get("active", counts["total"])
    assert shape.kv_bytes_per_token() == counts["kv_bytes"]  # fp16/bf16
    assert shape.kv_bytes_per_token(1.0) == counts["kv_bytes"] / 2  # fp8 KV


def test_hand_counts_are_the_published_ones():
    assert LLAMA_31_8B["total"] == pytest.approx(8.03e9, rel=0.01)
    assert MIXTRAL_8X7B["total"] == pytest.approx(46.7e9, rel=0.01)
    assert MIXTRAL_8X7B["active"] == pytest.approx(12.9e9, rel=0.01)
    assert DEEPSEEK_V3["total"] == pytest.approx(671e9, rel=0.01)


@pytest.mark.parametrize("model", shipped_models(), ids=lambda m: m.shape.name)
def test_parameter_counts_match_the_published_ones(model):
    assert model.shape.total_params() == pytest.approx(model.published_params, rel=0.02)
    if model.published_active_params:
        assert model.shape.active_params() == pytest.approx(model.published_active_params, rel=0.03)


@pytest.mark.parametrize(
    "path, name",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("meta-llama/Llama-2-13b-chat-hf", "Llama-2-13B"),
        ("Qwen/Qwen3-8B", "Qwen3-8B"),
        ("Qwen/Qwen3-32B", "Qwen3-32B"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B"),
        ("deepseek-ai/DeepSeek-V3-0324", "DeepSeek-V3"),
        ("/models/deepseek-r1", "DeepSeek-V3"),
    ],
)
def test_names_match_shipped_configs(path, name):
    shape = resolve_model(path)
    assert (shape.name, shape.source) == (name, "shipped")
    assert shape.config_path.startswith("https://huggingface.co/")


def test_unknown_model_falls_back_to_8b_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="kit.perf.models"):
        shape = resolve_model("acme/secret-model")
    assert not shape.matched and shape.source == "fallback"
    assert shape.total_params() == resolve_model("Llama-3.1-8B").total_params()
    assert "no shape known" in caplog.text and "To fix" in caplog.text


LLAMA_32_1B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
}


def test_local_model_folder_config_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_32_1B))
    shape = resolve_model(str(tmp_path))
    assert shape.layers == 16 and shape.head_dim == 64 and shape.tie_embeddings
    assert shape.total_params() == pytest.approx(1.24e9, rel=0.02)  # Llama-3.2-1B
    assert (shape.source, shape.config_path) == ("local", str(tmp_path / "config.json"))


def test_a_config_file_path_is_read(tmp_path):
    path = tmp_path / "llama-1b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_32_1B))
    shape = resolve_model(str(path))
    assert (shape.name, shape.layers, shape.source) == ("llama-1b", 16, "local")


def cache_repo(cache, repo_id, snapshots, main=None):
    """A hub-cache layout: `snapshots` maps a commit hash to a config dict (None: no
    config.json in that snapshot); `main` is the hash refs/main names. Snapshots are made in
    order, each newer than the last."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for i, (commit, config) in enumerate(snapshots.items()):
        folder = repo / "snapshots" / commit
        folder.mkdir(parents=True)
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        os.utime(folder, (1_700_000_000 + i, 1_700_000_000 + i))
    if main is not None:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(main)


def test_an_org_name_id_is_read_from_the_hf_cache(empty_hf_cache):
    old = {**LLAMA_32_1B, "num_hidden_layers": 12}
    cache_repo(empty_hf_cache, "acme/tiny-llama", {"aaa": LLAMA_32_1B, "bbb": old}, main="aaa")
    shape = resolve_model("acme/tiny-llama")
    assert (shape.name, shape.layers, shape.source) == ("tiny-llama", 16, "hf-cache")
    assert shape.config_path == str(
        empty_hf_cache / "models--acme--tiny-llama" / "snapshots" / "aaa" / "config.json"
    )


def test_without_refs_main_the_newest_snapshot_with_a_config_is_read(empty_hf_cache):
    old = {**LLAMA_32_1B, "num_hidden_layers": 12}
    cache_repo(empty_hf_cache, "acme/tiny-llama", {"old": old, "new": LLAMA_32_1B, "bare": None})
    shape = resolve_model("acme/tiny-llama")
    assert (shape.layers, shape.source) == (16, "hf-cache")


def test_a_cached_repo_without_a_config_falls_through_to_the_shipped_ones(empty_hf_cache):
    cache_repo(empty_hf_cache, "meta-llama/Llama-2-13b-hf", {"aaa": None}, main="aaa")
    assert resolve_model("meta-llama/Llama-2-13b-hf").source == "shipped"


def test_the_cache_folder_follows_huggingface_hub():
    assert hub_cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}).as_posix() == "/c"
    assert hub_cache_dir({"HF_HOME": "/h"}).as_posix() == "/h/hub"
    assert hub_cache_dir({"XDG_CACHE_HOME": "/x"}).as_posix() == "/x/huggingface/hub"
    assert hub_cache_dir({}).parts[-3:] == (".cache", "huggingface", "hub")


def test_unreadable_json_names_the_file_and_the_fix(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json: cannot read it") as err:
        resolve_model(str(tmp_path))
    assert str(tmp_path) in str(err.value) and "To fix" in str(err.value)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"vocab_size": None}, "has no field vocab_size"),
        ({"hidden_size": None}, "has no field hidden_size or d_model"),
        ({"num_attention_heads": "32"}, "field num_attention_heads is '32'"),
        ({"num_hidden_layers": 0}, "field num_hidden_layers is 0"),
    ],
)
def test_a_bad_field_is_named_with_the_file_and_the_fix(tmp_path, change, needle):
    config = {k: v for k, v in {**LLAMA_32_1B, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=needle) as err:
        resolve_model(str(tmp_path))
    assert str(tmp_path / "config.json") in str(err.value) and "To fix" in str(err.value)
