"""Model shapes: what the timing model needs to know about a model.

A shape comes from a Hugging Face ``config.json``; `resolve_model` looks, in order, at:

1. a local path: a model folder holding ``config.json``, or the path of a config file;
2. the local Hugging Face hub cache, for an ``org/name`` id (`kit.perf.hfcache`; no network);
3. the configs shipped in ``kit/perf/models/*.json``, matched by name;
4. else `DEFAULT_MODEL` (8B class), with a warning.

The shape's `ModelShape.source` says which it was. Parameter counts and KV bytes per token are
derived from the shape (tests check them against hand-computed and published counts); nothing
is read from the weights. Norms and biases are left out of the counts (well under 0.1%).

Name matching: the last path component is lower-cased and compared with each shipped config's
``match`` prefixes; the longest prefix that ends at a word boundary (end of name, ``-``, ``_``
or ``.``) wins, so ``meta-llama/Llama-3.1-8B-Instruct`` matches ``llama-3.1-8b``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from kit.errors import PdkitError
from kit.perf.hfcache import cached_config, hub_cache_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "Llama-3.1-8B"
BOUNDARY = ("-", "_", ".")
# The config.json fields every shape needs (alternatives after the first).
REQUIRED_FIELDS = (
    ("hidden_size", "d_model"),
    ("num_attention_heads",),
    ("num_hidden_layers",),
    ("intermediate_size",),
    ("vocab_size",),
)

ShapeSource = Literal["local", "hf-cache", "shipped", "fallback"]


class ModelConfigError(PdkitError, ValueError):
    """A config.json that cannot be read, or lacks a field the timing model needs; the message
    names the file, the field and the fix."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, dense or MoE, with MHA/GQA or MLA attention.

    Sizes are element counts; `weight_bytes` is bytes per element. `source` says where the
    numbers came from (see `resolve_model`) and `config_path` which file: a path, or for a
    shipped config the URL it was copied from.
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_len: int
    tie_embeddings: bool = False
    weight_bytes: float = 2.0
    # MoE (experts == 0: dense). Layers [0, dense_layers) use the dense MLP.
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    # MLA (kv_lora_rank == 0: MHA/GQA).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    source: ShapeSource = "shipped"
    config_path: str = ""
    model_type: str = ""
    architectures: tuple[str, ...] = ()

    @property
    def matched(self) -> bool:
        """False when the model was not found and the default shape stands in for it."""
        return self.source != "fallback"

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def attention_params(self) -> int:
        """Weights of one attention block (elements)."""
        h = self.hidden
        if self.is_mla:
            qk = self.qk_nope_dim + self.qk_rope_dim
            q = (
                h * self.q_lora_rank + self.q_lora_rank * self.heads * qk
                if self.q_lora_rank
                else h * self.heads * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_rope_dim) + self.kv_lora_rank * self.heads * (
                self.qk_nope_dim + self.v_head_dim
            )
            return q + kv + self.heads * self.v_head_dim * h
        q_out = self.heads * self.head_dim
        return 2 * h * q_out + 2 * h * self.kv_heads * self.head_dim

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden * self.moe_intermediate

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def layer_params(self) -> int:
        """Weights read for every token whatever the routing: attention, dense MLPs, shared
        experts and routers, over all layers."""
        dense = self.layers - self.moe_layers
        shared = self.moe_layers * (
            self.shared_experts * self.expert_params() + self.hidden * self.experts
        )
        return self.layers * self.attention_params() + dense * self.dense_mlp_params() + shared

    def routed_params(self) -> int:
        """All routed-expert weights over all MoE layers."""
        return self.moe_layers * self.experts * self.expert_params()

    def total_params(self) -> int:
        return self.layer_params() + self.routed_params() + self.embedding_params()

    def active_params(self) -> int:
        """Parameters one token multiplies through (embedding lookup and LM head included)."""
        routed = self.moe_layers * self.experts_per_token * self.expert_params()
        return self.layer_params() + routed + self.embedding_params()

    def kv_elements_per_token(self) -> int:
        """KV-cache elements one token adds over all layers: K and V per KV head for MHA/GQA,
        the compressed latent plus the RoPE key for MLA."""
        if self.is_mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        """KV-cache bytes one token adds over all layers (K and V, or the MLA latent), at
        `kv_dtype_bytes` bytes per element (2: fp16/bf16, 1: fp8)."""
        return self.kv_elements_per_token() * kv_dtype_bytes

    def attention_flops_per_pair(self) -> float:
        """FLOPs of QK^T and AV for one (query token, context token) pair over all layers."""
        # Absorbed MLA attends in the latent space: scores over kv_lora_rank + rope dims,
        # values over kv_lora_rank.
        dims = 2 * self.kv_lora_rank + self.qk_rope_dim if self.is_mla else 2 * self.head_dim
        return 2.0 * self.layers * self.heads * dims

    def describe(self) -> dict[str, Any]:
        """A summary for /server_info."""
        return {
            "name": self.name,
            "matched": self.matched,
            "source": self.source,
            "config": self.config_path,
            "total_params_b": round(self.total_params() / 1e9, 2),
            "active_params_b": round(self.active_params() / 1e9, 2),
            "layers": self.layers,
            "kv_elements_per_token": self.kv_elements_per_token(),
            "kv_bytes_per_token_16bit": self.kv_bytes_per_token(2.0),
            "weight_bytes": self.weight_bytes,
            "moe": self.is_moe,
            "mla": self.is_mla,
        }


def shape_from_config(
    name: str,
    cfg: dict[str, Any],
    *,
    source: ShapeSource = "local",
    config_path: str = "",
) -> ModelShape:
    """Build a shape from Hugging Face config.json fields (a multimodal config's
    ``text_config`` fills in what the top level lacks)."""
    where = config_path or name
    if not isinstance(cfg, dict):
        raise ModelConfigError(
            f"{where}: config.json holds a {type(cfg).__name__}, not an object. To fix: use "
            "the model's Hugging Face config.json."
        )
    text = cfg.get("text_config")
    cfg = {**(text if isinstance(text, dict) else {}), **cfg}
    fields = ", ".join(keys[0] for keys in REQUIRED_FIELDS)

    def number(key: str, value: Any, least: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < least:
            raise ModelConfigError(
                f"{where}: config.json field {key} is {value!r}, not a number >= {least}. "
                "To fix: use the model's Hugging Face config.json."
            )
        return int(value)

    def need(*keys: str) -> int:
        for key in keys:
            if cfg.get(key) is not None:
                return number(key, cfg[key], 1)
        raise ModelConfigError(
            f"{where}: config.json has no field {' or '.join(keys)}. To fix: use the model's "
            f"full Hugging Face config.json (the performance model reads {fields})."
        )

    def get(key: str, default: int = 0) -> int:
        value = cfg.get(key)
        return default if value is None else number(key, value, 0)

    hidden = need("hidden_size", "d_model")
    heads = need("num_attention_heads")
    layers = need("num_hidden_layers")
    intermediate = need("intermediate_size")
    vocab = need("vocab_size")
    # DeepSeek: n_routed_experts; Qwen MoE: num_experts; Mixtral: num_local_experts.
    experts = get("n_routed_experts") or get("num_experts") or get("num_local_experts")
    # Mixtral's experts are full-size MLPs: it has no moe_intermediate_size.
    moe_intermediate = get("moe_intermediate_size") or (intermediate if experts else 0)
    if experts:
        dense_layers = max(get("first_k_dense_replace"), len(cfg.get("mlp_only_layers") or []))
        shared = get("n_shared_experts")
        if not shared and cfg.get("shared_expert_intermediate_size"):
            shared = math.ceil(get("shared_expert_intermediate_size") / moe_intermediate)
    else:
        dense_layers = shared = 0
    quant_config = cfg.get("quantization_config")
    quant = quant_config.get("quant_method", "") if isinstance(quant_config, dict) else ""
    return ModelShape(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or hidden // heads,
        intermediate=intermediate,
        vocab=vocab,
        context_len=get("max_position_embeddings") or 4096,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        weight_bytes=_weight_bytes(quant),
        experts=experts,
        experts_per_token=get("num_experts_per_tok"),
        moe_intermediate=moe_intermediate,
        shared_experts=shared,
        dense_layers=dense_layers,
        kv_lora_rank=get("kv_lora_rank"),
        q_lora_rank=get("q_lora_rank"),
        qk_nope_dim=get("qk_nope_head_dim"),
        qk_rope_dim=get("qk_rope_head_dim"),
        v_head_dim=get("v_head_dim"),
        source=source,
        config_path=config_path,
        model_type=str(cfg.get("model_type") or ""),
        architectures=tuple(cfg.get("architectures") or ()),
    )


def _weight_bytes(quant_method: str) -> float:
    """Bytes per weight element: checkpoints ship in 16 bits unless quantized."""
    if quant_method in ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt"):
        return 1.0
    if quant_method in ("awq", "gptq", "mxfp4", "modelopt_fp4"):
        return 0.5
    return 2.0


@dataclass(frozen=True)
class ShippedModel:
    shape: ModelShape
    match: tuple[str, ...]
    published_params: float
    published_active_params: float | None


@cache
def shipped_models() -> tuple[ShippedModel, ...]:
    """The configs in kit/perf/models/, in file-name order."""
    out = []
    folder = resources.files("kit.perf") / "models"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        data = json.loads(entry.read_text(encoding="utf-8"))
        shape = shape_from_config(
            data["name"], data["config"], source="shipped", config_path=data["source"]
        )
        out.append(
            ShippedModel(
                shape=shape,
                match=tuple(m.lower() for m in data["match"]),
                published_params=float(data["published_params"]),
                published_active_params=data.get("published_active_params"),
            )
        )
    return tuple(out)


def match_shipped(model_path: str) -> ModelShape | None:
    """The shipped shape whose name matches `model_path` (see module doc), or None."""
    base = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    best: tuple[int, ModelShape] | None = None
    for model in shipped_models():
        for prefix in model.match:
            rest = base[len(prefix) :]
            if (
                base.startswith(prefix)
                and (not rest or rest[0] in BOUNDARY)
                and (best is None or len(prefix) > best[0])
            ):
                best = (len(prefix), model.shape)
    return best[1] if best else None


def read_config(path: Path, name: str, source: ShapeSource) -> ModelShape:
    """The shape of the config.json at `path` (a file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(
            f"{path}: cannot read it as a config.json ({exc}). To fix: point at the model's "
            "Hugging Face config.json, or at the folder that holds it."
        ) from exc
    return shape_from_config(name, data, source=source, config_path=str(path))


def resolve_model(name_or_path: str) -> ModelShape:
    """The shape for a model path or name (``--model-path``, the topology's ``model.path``):
    a local config, the Hugging Face cache, a shipped config, else the default 8B-class shape
    (logged as a warning). See the module docstring for the order."""
    local = Path(name_or_path).expanduser()
    if local.is_file():
        return read_config(local, local.parent.name or local.stem, "local")
    if (local / "config.json").is_file():
        return read_config(local / "config.json", local.name, "local")
    cached = cached_config(name_or_path)
    if cached is not None:
        return read_config(cached, name_or_path.rsplit("/", 1)[-1], "hf-cache")
    shape = match_shipped(name_or_path)
    if shape is not None:
        return shape
    default = match_shipped(DEFAULT_MODEL)
    assert default is not None, "the default model config is shipped"
    logger.warning(
        "no shape known for model %r (no local config.json, nothing in the Hugging Face cache "
        "at %s); timing it as %s. To fix: point the model path at a folder with a "
        "config.json, or use one of: %s",
        name_or_path,
        hub_cache_dir(),
        DEFAULT_MODEL,
        ", ".join(m.shape.name for m in shipped_models()),
    )
    return replace(default, source="fallback", name=f"{name_or_path} (as {DEFAULT_MODEL})")
