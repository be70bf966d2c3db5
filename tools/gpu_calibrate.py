"""Time a random-weights Llama-shaped model's prefill and decode steps on one GPU.

Self-contained (plain PyTorch, no pdkit import): it runs under a GPU machine's own python3.
The raw timings it writes (JSON) are what `tools/fit_perf.py` fits `kit.perf.timing`'s
roofline constants to; `docs/sim.md` ("Calibration on an H200") has a run's numbers.

What it builds: for each shape, a decoder with random bf16 weights (N(0, 1/fan_in)), written
out in torch ops: RMSNorm, rotary, fused QKV, GQA attention through
`F.scaled_dot_product_attention`, fused gate/up SwiGLU MLP, a preallocated KV cache (one random
pool reused), greedy sampling. Not SGLang's kernels (no fused add-norm, rotary or
silu-and-mul kernels, no FlashInfer): a plain-torch baseline.

What it times, with CUDA events after warm-up (median of repeats):

* prefill, batch 1, eagerly (SGLang runs prefill outside CUDA graphs): L tokens from an empty
  cache, and chunks of L new tokens after `cached` tokens already in the cache; the LM head
  runs on the last token only, as SGLang's;
* decode steps of B requests at context C each, captured in a CUDA graph (SGLang decodes under
  CUDA graphs) and replayed, plus a few eager steps to show what the graph saves;
* the two ceilings: a device-to-device copy (bytes read + written) and an 8192^3 bf16 matmul.

It writes the JSON after every shape, so a run stopped at its limit keeps what it measured.
`--tiny` runs tiny shapes on the CPU (a smoke test, with a check that a decode step after a
prefill gives the logits a longer prefill gives).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.backends.cuda import SDPAParams, can_use_flash_attention
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

T0 = time.monotonic()


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False


LLAMA_8B = Shape("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256)
# Llama-3.1-8B's layers, 4 of them: the same kernels per layer, so the per-layer cost
# separates from the per-step cost.
LLAMA_8B_4L = Shape("llama-3.1-8b-4layers", 4096, 4, 32, 8, 128, 14336, 128256)
LLAMA_1B = Shape("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, tie_embeddings=True)
TINY = Shape("tiny", 64, 2, 4, 2, 16, 128, 256)
TINY_2 = Shape("tiny-1layer", 64, 1, 4, 2, 16, 128, 256)


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class Timer:
    """Elapsed seconds of `fn()`: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any], repeat: int = 1) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeat):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / repeat
        begin = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - begin) / repeat


class Model:
    """A Llama-shaped decoder with random weights and a KV cache carved from `pool`."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype) -> None:
        self.s = shape
        self.device, self.dtype = device, dtype
        s = shape

        def rand(*size: int) -> torch.Tensor:
            w = torch.randn(*size, device=device, dtype=dtype)
            return w.mul_(1.0 / math.sqrt(size[-1]))

        self.embed = torch.randn(s.vocab, s.hidden, device=device, dtype=dtype)
        self.lm_head = self.embed if s.tie_embeddings else rand(s.vocab, s.hidden)
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.layers = []
        for _ in range(s.layers):
            self.layers.append(
                {
                    "norm1": 1.0 + 0.1 * torch.randn(s.hidden, device=device, dtype=dtype),
                    "qkv": rand(qkv_out, s.hidden),
                    "o": rand(s.hidden, s.heads * s.head_dim),
                    "norm2": 1.0 + 0.1 * torch.randn(s.hidden, device=device, dtype=dtype),
                    "gate_up": rand(2 * s.intermediate, s.hidden),
                    "down": rand(s.hidden, s.intermediate),
                }
            )
        self.final_norm = 1.0 + 0.1 * torch.randn(s.hidden, device=device, dtype=dtype)
        inv = 1.0 / (
            500000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim)
        )
        self.inv_freq = inv
        self.cache: torch.Tensor | None = None  # [layers, 2, batch, kv_heads, ctx, head_dim]

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.final_norm] + ([] if self.s.tie_embeddings else [self.lm_head])
        for layer in self.layers:
            tensors.extend(layer.values())
        return sum(t.numel() * t.element_size() for t in tensors)

    def kv_bytes_per_token(self) -> int:
        s = self.s
        return 2 * s.layers * s.kv_heads * s.head_dim * torch.finfo(self.dtype).bits // 8

    def use_cache(self, pool: torch.Tensor, batch: int, ctx: int) -> None:
        s = self.s
        n = s.layers * 2 * batch * s.kv_heads * ctx * s.head_dim
        if n > pool.numel():
            raise ValueError(f"KV pool too small for batch {batch} x ctx {ctx}")
        self.cache = pool[:n].view(s.layers, 2, batch, s.kv_heads, ctx, s.head_dim)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [tokens, heads, head_dim]; cos/sin: [tokens, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, 1e-5)

    def mlp(self, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> torch.Tensor:
        g, u = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, layer["down"])

    def qkv(
        self, x: torch.Tensor, layer: dict[str, torch.Tensor], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        t = x.shape[0]
        qkv = F.linear(x, layer["qkv"])
        q, k, v = qkv.split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        cos, sin = self.rope(positions)
        q = self.rotate(q.view(t, s.heads, s.head_dim), cos, sin)
        k = self.rotate(k.view(t, s.kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(t, s.kv_heads, s.head_dim)

    def prefill(
        self, tokens: torch.Tensor, cached: int, attend: Callable[..., torch.Tensor]
    ) -> torch.Tensor:
        """One request's chunk of `tokens` after `cached` cached tokens; logits of the last."""
        s = self.s
        assert self.cache is not None
        n = tokens.shape[0]
        positions = torch.arange(cached, cached + n, device=self.device)
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            h = self.norm(x, layer["norm1"])
            q, k, v = self.qkv(h, layer, positions)
            kc, vc = self.cache[i, 0, 0], self.cache[i, 1, 0]  # [kv_heads, ctx, head_dim]
            kc[:, cached : cached + n] = k.transpose(0, 1)
            vc[:, cached : cached + n] = v.transpose(0, 1)
            o = attend(
                q.transpose(0, 1)[None],
                kc[None, :, : cached + n],
                vc[None, :, : cached + n],
                n,
                cached + n,
            )  # [1, heads, n, head_dim]
            x = x + F.linear(o[0].transpose(0, 1).reshape(n, s.heads * s.head_dim), layer["o"])
            x = x + self.mlp(self.norm(x, layer["norm2"]), layer)
        return F.linear(self.norm(x[-1:], self.final_norm), self.lm_head)

    def decode(self, tokens: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: each of the batch's requests holds `pos` cached tokens and adds
        one; returns (logits, next tokens)."""
        s = self.s
        assert self.cache is not None
        b = tokens.shape[0]
        group = s.heads // s.kv_heads
        positions = torch.full((b,), pos, device=self.device, dtype=torch.long)
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            h = self.norm(x, layer["norm1"])
            q, k, v = self.qkv(h, layer, positions)
            kc, vc = self.cache[i, 0], self.cache[i, 1]  # [batch, kv_heads, ctx, head_dim]
            kc[:, :, pos] = k
            vc[:, :, pos] = v
            # GQA decode as plain attention: a KV head's `group` query heads are its queries.
            o = F.scaled_dot_product_attention(
                q.view(b, s.kv_heads, group, s.head_dim), kc[:, :, : pos + 1], vc[:, :, : pos + 1]
            )
            x = x + F.linear(o.reshape(b, s.heads * s.head_dim), layer["o"])
            x = x + self.mlp(self.norm(x, layer["norm2"]), layer)
        logits = F.linear(self.norm(x, self.final_norm), self.lm_head)
        return logits, logits.argmax(dim=-1)


def make_attend(device: torch.device, choices: dict[str, str]) -> Callable[..., torch.Tensor]:
    """Causal prefill attention over the chunk and its prefix (a lower-right causal mask when
    a prefix is cached). KV heads are shared natively (GQA) where the flash kernel takes them,
    else repeated; the math backend (which materialises the scores) is not allowed on a GPU."""
    fast = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    allowed = fast if device.type == "cuda" else [*fast, SDPBackend.MATH]
    state: dict[str, bool] = {}

    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, total: int
    ) -> torch.Tensor:
        if "gqa" not in state:
            params = SDPAParams(q, k, v, None, 0.0, True, True)
            state["gqa"] = device.type != "cuda" or bool(can_use_flash_attention(params, False))
            choices["prefill_attention"] = (
                "sdpa flash, GQA native" if state["gqa"] else "sdpa, KV heads repeated"
            ) + (" (cpu)" if device.type != "cuda" else "")
        gqa = state["gqa"]
        if not gqa:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        with sdpa_kernel(allowed):
            if n == total:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            mask = causal_lower_right(n, total)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    return attend


def median_time(
    timer: Timer, fn: Callable[[], Any], reps: int, inner: int = 1
) -> tuple[float, list[float]]:
    samples = [timer(fn, inner) for _ in range(reps)]
    return statistics.median(samples), samples


def ceilings(device: torch.device, timer: Timer, tiny: bool) -> dict[str, float]:
    n = 1 << (16 if tiny else 31)  # 4 GiB of bf16 on the GPU
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t, _ = median_time(timer, functools.partial(dst.copy_, src), 5, 3)
    copy_bw = 2 * n * 2 / t
    del src, dst
    m = 256 if tiny else 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    torch.matmul(a, b)
    t, _ = median_time(timer, functools.partial(torch.matmul, a, b), 5, 5)
    return {"copy_bytes_per_s": copy_bw, "matmul_bf16_flops": 2 * m**3 / t, "matmul_n": m}


def time_prefills(
    model: Model,
    pool: torch.Tensor,
    timer: Timer,
    points: list[tuple[int, int]],
    *,
    reps: int,
    choices: dict[str, str],
    deadline: float,
) -> list[dict[str, Any]]:
    out = []
    attend = make_attend(model.device, choices)
    for new, cached in points:
        if time.monotonic() > deadline:
            log(f"  deadline: skipping prefill {new}+{cached}")
            continue
        model.use_cache(pool, 1, cached + new)
        tokens = torch.randint(0, model.s.vocab, (new,), device=model.device)
        try:
            with torch.no_grad():
                fn = functools.partial(model.prefill, tokens, cached, attend)
                fn()
                med, samples = median_time(timer, fn, reps)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            log(f"  prefill {new}+{cached}: FAILED {exc}")
            out.append({"new": new, "cached": cached, "error": str(exc)[:300]})
            continue
        log(f"  prefill new={new:6d} cached={cached:6d}: {med * 1e3:9.3f} ms")
        out.append({"new": new, "cached": cached, "seconds": med, "samples": samples})
    return out


def time_decodes(
    model: Model,
    pool: torch.Tensor,
    timer: Timer,
    points: list[tuple[int, int]],
    *,
    reps: int,
    graph: bool,
    deadline: float,
    check: bool = False,
) -> list[dict[str, Any]]:
    out = []
    for batch, ctx in points:
        if time.monotonic() > deadline:
            log(f"  deadline: skipping decode {batch}x{ctx}")
            continue
        model.use_cache(pool, batch, ctx)
        tokens = torch.randint(0, model.s.vocab, (batch,), device=model.device)
        pos = ctx - 1  # the step attends over ctx tokens, its own included
        entry: dict[str, Any] = {"batch": batch, "context": ctx, "graph": graph}
        try:
            with torch.no_grad():
                if graph:
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        for _ in range(2):
                            eager_logits, _ = model.decode(tokens, pos)
                    torch.cuda.current_stream().wait_stream(stream)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        logits, _ = model.decode(tokens, pos)
                    for _ in range(3):
                        g.replay()
                    if check:
                        diff = (
                            logits.float() - eager_logits.float()
                        ).norm() / eager_logits.float().norm()
                        entry["graph_vs_eager_rel_diff"] = float(diff)
                        entry["logits_finite"] = bool(torch.isfinite(logits).all())
                    med, samples = median_time(timer, g.replay, reps, 4)
                    del g, logits
                else:
                    fn = functools.partial(model.decode, tokens, pos)
                    fn()
                    fn()
                    med, samples = median_time(timer, fn, reps, 2)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            log(f"  decode {batch}x{ctx}: FAILED {exc}")
            entry["error"] = str(exc)[:300]
            out.append(entry)
            continue
        entry.update({"seconds": med, "samples": samples})
        log(f"  decode B={batch:4d} C={ctx:6d} graph={graph}: {med * 1e3:8.3f} ms")
        out.append(entry)
    return out


def check_tiny(device: torch.device, dtype: torch.dtype) -> float:
    """Relative error of a decode step after a prefill, and of a chunk after a cached prefix,
    against the last logits of one longer prefill (the same function, computed otherwise)."""
    torch.manual_seed(1)
    model = Model(TINY, device, dtype)

    def pool() -> torch.Tensor:
        n = TINY.layers * 2 * TINY.kv_heads * 64 * TINY.head_dim
        return torch.randn(n, device=device, dtype=dtype)

    attend = make_attend(device, {})
    tokens = torch.randint(0, TINY.vocab, (17,), device=device)
    with torch.no_grad():
        model.use_cache(pool(), 1, 17)
        ref17 = model.prefill(tokens, 0, attend).float()
        model.use_cache(pool(), 1, 16)
        ref16 = model.prefill(tokens[:16], 0, attend).float()
        model.use_cache(pool(), 1, 17)
        model.prefill(tokens[:10], 0, attend)
        chunk = model.prefill(tokens[10:16], 10, attend).float()  # a chunk after a prefix
        logits, _ = model.decode(tokens[16:], 16)
    errors = [(logits.float() - ref17).norm() / ref17.norm(), (chunk - ref16).norm() / ref16.norm()]
    return float(max(errors))


def nvidia_smi() -> str:
    query = (
        "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,"
        "temperature.gpu"
    )
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (smoke test)")
    ap.add_argument(
        "--budget-s", type=float, default=300.0, help="stop starting new points after this"
    )
    args = ap.parse_args()
    deadline = T0 + args.budget_s
    tiny = args.tiny
    device = torch.device("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    timer = Timer(device)
    result: dict[str, Any] = {
        "script": "tools/gpu_calibrate.py",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "host": platform.node(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "method": "CUDA events, median of repeats after warm-up; decode replayed from a CUDA graph",
        "shapes": [],
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        result["sms"] = p.multi_processor_count
        result["memory_bytes"] = p.total_memory
        result["nvidia_smi"] = nvidia_smi()

    def save() -> None:
        result["elapsed_s"] = time.monotonic() - T0
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    checks = [(torch.float32, 1e-3)] + ([(torch.bfloat16, 5e-2)] if device.type == "cuda" else [])
    for check_dtype, tolerance in checks:
        err = check_tiny(device, check_dtype)
        result[f"check_rel_err_{str(check_dtype).split('.')[-1]}"] = err
        log(f"check ({check_dtype}): decode/chunk vs one longer prefill, relative error {err:.2e}")
        if not err < tolerance:
            log("CHECK FAILED")
            save()
            return 1

    result["ceilings"] = ceilings(device, timer, tiny)
    log(f"ceilings: {result['ceilings']}")
    save()

    if tiny:
        shapes = [TINY, TINY_2]
        prefill_points = [(16, 0), (64, 0), (32, 32)]
        decode_points = [(1, 16), (4, 64), (8, 32)]
        eager_points = [(1, 16)]
        pool_tokens = 1024
        reps = 3
    else:
        shapes = [LLAMA_8B, LLAMA_8B_4L, LLAMA_1B]
        prefill_points = [(n, 0) for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)]
        prefill_points += [(4096, 4096), (4096, 12288), (8192, 8192), (16384, 16384)]
        decode_points = [
            (b, c)
            for c in (512, 2048, 8192, 32768)
            for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)
            if b * c <= 1 << 19
        ]
        eager_points = [(1, 2048), (32, 2048), (128, 2048)]
        pool_tokens = 1 << 19
        reps = 5
    kv_per_token = max(2 * s.layers * s.kv_heads * s.head_dim for s in shapes)
    pool = torch.empty(pool_tokens * kv_per_token, device=device, dtype=dtype)
    for part in pool.split(1 << 28):
        part.normal_()
    log(f"KV pool: {pool.numel() * pool.element_size() / 2**30:.1f} GiB")
    choices: dict[str, str] = {}
    for shape in shapes:
        log(f"shape {shape.name}")
        torch.manual_seed(0)
        model = Model(shape, device, dtype)
        entry: dict[str, Any] = {
            "shape": asdict(shape),
            "weight_bytes": model.weight_bytes(),
            "kv_bytes_per_token": model.kv_bytes_per_token(),
        }
        result["shapes"].append(entry)
        entry["prefill"] = time_prefills(
            model, pool, timer, prefill_points, reps=reps, choices=choices, deadline=deadline
        )
        entry["attention"] = dict(choices)
        save()
        graph = device.type == "cuda"
        entry["decode"] = time_decodes(
            model, pool, timer, decode_points, reps=reps, graph=graph, deadline=deadline, check=True
        )
        save()
        entry["decode_eager"] = time_decodes(
            model, pool, timer, eager_points, reps=reps, graph=False, deadline=deadline
        )
        save()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
            entry["max_memory_allocated"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
    if device.type == "cuda":
        result["nvidia_smi_after"] = nvidia_smi()
    log(f"done in {time.monotonic() - T0:.1f}s -> {args.out}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
