"""Model shapes: what the timing model needs to know about a model.

Shapes come from a Hugging Face ``config.json``: either one of the configs shipped in
``kit/perf/models/*.json`` (matched by the name in ``--model-path``) or the ``config.json`` of a
local model folder. Parameter counts are derived from the shape (tests check them against the
published counts); nothing is read from the weights.

Name matching: the last path component of ``--model-path`` is lower-cased and compared with
each shipped config's ``match`` prefixes; the longest prefix that ends at a word boundary
(end of name, ``-``, ``_`` or ``.``) wins, so ``meta-llama/Llama-3.1-8B-Instruct`` matches
``llama-3.1-8b``. An unknown model falls back to `DEFAULT_MODEL` (8B class) with a warning.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "Llama-3.1-8B"
BOUNDARY = ("-", "_", ".")


class ModelConfigError(ValueError):
    """A config.json that lacks a field the timing model needs."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, dense or MoE, with MHA/GQA or MLA attention.

    Sizes are element counts; `weight_bytes` and `kv_dtype_bytes` are bytes per element.
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
    matched: bool = True
    source: str = ""
    model_type: str = ""
    architectures: tuple[str, ...] = ()

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
            "total_params_b": round(self.total_params() / 1e9, 2),
            "active_params_b": round(self.active_params() / 1e9, 2),
            "layers": self.layers,
            "kv_elements_per_token": self.kv_elements_per_token(),
            "weight_bytes": self.weight_bytes,
            "moe": self.is_moe,
            "mla": self.is_mla,
        }


def shape_from_config(name: str, cfg: dict[str, Any], source: str = "") -> ModelShape:
    """Build a shape from Hugging Face config.json fields."""
    cfg = {**cfg.get("text_config", {}), **cfg}

    def need(*keys: str) -> Any:
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
        raise ModelConfigError(f"{source or name}: config.json has no {' or '.join(keys)}")

    hidden = int(need("hidden_size", "d_model"))
    heads = int(need("num_attention_heads"))
    layers = int(need("num_hidden_layers"))
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    if experts:
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        dense_layers = max(dense_layers, len(cfg.get("mlp_only_layers") or []))
        shared = int(cfg.get("n_shared_experts") or 0)
        if not shared and cfg.get("shared_expert_intermediate_size"):
            shared = math.ceil(
                cfg["shared_expert_intermediate_size"] / cfg["moe_intermediate_size"]
            )
    else:
        dense_layers = shared = 0
    quant = (cfg.get("quantization_config") or {}).get("quant_method", "")
    return ModelShape(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(need("intermediate_size")),
        vocab=int(need("vocab_size")),
        context_len=int(cfg.get("max_position_embeddings") or 4096),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        weight_bytes=_weight_bytes(quant),
        experts=experts,
        experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0),
        shared_experts=shared,
        dense_layers=dense_layers,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        qk_nope_dim=int(cfg.get("qk_nope_head_dim") or 0),
        qk_rope_dim=int(cfg.get("qk_rope_head_dim") or 0),
        v_head_dim=int(cfg.get("v_head_dim") or 0),
        source=source,
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
        shape = shape_from_config(data["name"], data["config"], source=data["source"])
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


def resolve_model(model_path: str) -> ModelShape:
    """The shape for ``--model-path``: a local folder's config.json, else a shipped config
    matched by name, else the default 8B-class shape (logged as a warning)."""
    config = Path(model_path) / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"{config}: cannot read config.json: {exc}") from exc
        return shape_from_config(Path(model_path).name, data, source=str(config))
    shape = match_shipped(model_path)
    if shape is not None:
        return shape
    default = match_shipped(DEFAULT_MODEL)
    assert default is not None, "the default model config is shipped"
    logger.warning(
        "sim: no shape known for model %r; timing it as %s. To fix: point --model-path at a "
        "folder with a config.json, or use one of: %s",
        model_path,
        DEFAULT_MODEL,
        ", ".join(m.shape.name for m in shipped_models()),
    )
    return replace(default, matched=False, name=f"{model_path} (as {DEFAULT_MODEL})")
