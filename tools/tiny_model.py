#!/usr/bin/env python3
"""A tiny random Llama with a locally trained tokenizer, for running the real SGLang on a CPU.

    python tools/tiny_model.py --out DIR [--seed 0] [--tokenizer-only]

Writes a Hugging Face model folder that SGLang loads with `--model-path DIR`: config.json,
generation_config.json, model.safetensors (bf16), tokenizer.json (byte-level BPE trained here on
a fixed corpus), tokenizer_config.json (with a chat template) and special_tokens_map.json.
Nothing is downloaded. The same seed gives byte-identical files.

Needs only numpy and tokenizers (both in the SGLang venv; --tokenizer-only, for a router's
tokenizer in a benchmark, needs no numpy and writes no weights); the safetensors file is written by
hand (an 8-byte header length, a JSON header, the raw tensors) so neither torch nor the
safetensors package is needed.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    import numpy as np

# The shape of the spike's model (about 420k parameters): small enough that the forward pass
# costs nothing beside SGLang's own overhead, big enough to exercise GQA (4 heads / 2 KV heads).
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
VOCAB = 1000
MAX_POSITIONS = 2048

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
UNK, BOS, EOS, PAD = SPECIAL_TOKENS[:4]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny tokenizer for a tiny model.",
    "Prefill and decode run on separate servers; the KV cache moves between them.",
    "SGLang serves a language model over HTTP with an OpenAI compatible API.",
    "Mooncake transfers the KV cache over TCP between the prefill and the decode server.",
    "What is the capital of France? The capital of France is Paris.",
    "Write a short poem about the sea. The sea is blue and wide and deep.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z",
    "system user assistant: you are a helpful assistant. Answer briefly.",
    '{"role": "user", "content": "hi"} [1, 2, 3] (x + y) * z = 42; print(\'ok\')',
]


def train_tokenizer():
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repetitions weight the corpus; the trainer is deterministic for a fixed input.
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tokenizer


def weights(seed: int, vocab: int) -> dict[str, np.ndarray]:
    """Llama weights under Hugging Face names, as float32; N(0, 0.02) like transformers' init."""
    import numpy as np  # noqa: PLC0415 - --tokenizer-only runs without numpy

    rng = np.random.Generator(np.random.PCG64(seed))
    head_dim = HIDDEN // HEADS

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    out = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = normal(HEADS * head_dim, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * head_dim, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * head_dim)
        out[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        out[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        out[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        out[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        out[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    out["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    out["lm_head.weight"] = normal(vocab, HIDDEN)
    return out


def to_bf16_bytes(array: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian bytes."""
    import numpy as np  # noqa: PLC0415 - --tokenizer-only runs without numpy

    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout (https://github.com/huggingface/safetensors#format), bf16 only."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        blob = to_bf16_bytes(tensors[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)  # the header is padded with spaces to 8-byte alignment
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build(out: Path, seed: int, *, tokenizer_only: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    vocab = tokenizer.get_vocab_size()
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "unk_token": UNK,
            "pad_token": PAD,
            "add_bos_token": False,
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD},
    )
    write_json(
        out / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HIDDEN // HEADS,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITIONS,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": ids[BOS],
            "eos_token_id": ids[EOS],
            "pad_token_id": ids[PAD],
            "torch_dtype": "bfloat16",
            "pdkit_tiny_model_seed": seed,
        },
    )
    write_json(
        out / "generation_config.json",
        {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]},
    )
    if tokenizer_only:
        print(f"tiny model's tokenizer in {out}: vocab {vocab} (no weights)")
        return
    tensors = weights(seed, vocab)
    write_safetensors(out / "model.safetensors", tensors)
    params = sum(a.size for a in tensors.values())
    print(f"tiny model in {out}: vocab {vocab}, {params} parameters, seed {seed}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="the tokenizer and config files without the weights (no numpy needed: a router's "
        "tokenizer for benchmarks)",
    )
    args = ap.parse_args()
    build(args.out, args.seed, tokenizer_only=args.tokenizer_only)


if __name__ == "__main__":
    main()
