"""Model shapes: shipped configs, name matching, local config.json."""

from __future__ import annotations

import json
import logging

import pytest

from kit.perf.models import resolve_model, shipped_models


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
        ("deepseek-ai/DeepSeek-V3-0324", "DeepSeek-V3"),
        ("/models/deepseek-r1", "DeepSeek-V3"),
    ],
)
def test_names_match_shipped_configs(path, name):
    assert resolve_model(path).name == name


def test_kv_bytes_per_token_follow_the_config():
    assert resolve_model("Llama-2-13b").kv_elements_per_token() * 2 == 819_200  # MHA, fp16
    assert resolve_model("Llama-3.1-8B").kv_elements_per_token() * 2 == 131_072  # GQA 8 heads
    assert resolve_model("DeepSeek-V3").kv_elements_per_token() == 61 * (512 + 64)  # MLA


def test_unknown_model_falls_back_to_8b_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="kit.perf.models"):
        shape = resolve_model("acme/secret-model")
    assert not shape.matched
    assert shape.total_params() == resolve_model("Llama-3.1-8B").total_params()
    assert "no shape known" in caplog.text and "To fix" in caplog.text


def test_local_model_folder_config_is_read(tmp_path):
    cfg = {
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
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = resolve_model(str(tmp_path))
    assert shape.layers == 16 and shape.head_dim == 64 and shape.tie_embeddings
    assert shape.total_params() == pytest.approx(1.24e9, rel=0.02)  # Llama-3.2-1B
