"""bench-lb's text workloads: OpenAI chat and completions bodies through the routers, pdkit's with
the model's tokenizer (`--prompt-tokens model:DIR`, the tiny model's tokenizer from
`tools/tiny_model.py --tokenizer-only`), pdkit's without one, and smg, on the same load.

- `chat`: /v1/chat/completions, a long system prompt shared by every request (`--system-tokens`)
  and a short user message of its own (requests cycle through `--text-bodies` distinct ones);
- `completions`: /v1/completions, one prompt string of the same length, each its own text;
- `completions_shared`: /v1/completions, the chat's system prompt and user message as one
  prompt string (a shared document or few-shot examples, then the question).
Non-streaming, `--tokens` new tokens each. The fake workers publish no KV events, so cache_aware
routes these as prefix_affinity does: what is measured is the tokenization (ids, admission,
validation, the chat bridge through /v1/completions), not the block hashing (the in-process
table, `benchmarks.lbbench.prompt_cpu`, has that).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.lbbench.load import LoadResult, closed_loop
from benchmarks.lbbench.prompt_cpu import WORDS
from benchmarks.lbbench.targets import LOG_DIR, REPO, Target, start, stop, targets
from tests.support.fake_worker import FakeWorkerProcess
from tests.support.fake_worker.model import MODEL

WORKLOADS = ("chat", "completions", "completions_shared")
TEXT_TARGETS = ("pdkit", "pdkit_tok", "smg")


def tokenizer_model(out: Path) -> Path:
    """The tiny model's tokenizer files in `out` (made once; no weights, no numpy)."""
    if not (out / "tokenizer.json").exists():
        tool = str(REPO / "tools" / "tiny_model.py")
        subprocess.run(
            [sys.executable, tool, "--out", str(out), "--tokenizer-only"],
            check=True,
            capture_output=True,
        )
    return out


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def bodies(workload: str, args: argparse.Namespace) -> Callable[[int], bytes] | list[bytes]:
    """The workload's bodies (words ~ 1.4 tokens each in the tiny model's tokenizer): for chat
    and completions_shared, the n-th request's, its question its own (n in it); for
    completions, `--text-bodies` prompts of random words sent in turn (more than the router's
    segment cache holds, so that each is new to it)."""
    rng = random.Random(7)
    system = _words(rng, args.system_tokens * 5 // 7)
    question = _words(rng, 40)

    def chat(n: int) -> bytes:
        user = f"question {n}: {question}"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return _dumps({"messages": messages}, args)

    def completions_shared(n: int) -> bytes:
        return _dumps({"prompt": f"{system} question {n}: {question}"}, args)

    if workload == "chat":
        return chat
    if workload == "completions_shared":
        return completions_shared
    return [
        _dumps({"prompt": f"{i} " + _words(rng, args.system_tokens * 5 // 7)}, args)
        for i in range(args.text_bodies)
    ]


def _dumps(body: dict[str, object], args: argparse.Namespace) -> bytes:
    return json.dumps(
        {"model": MODEL, **body, "max_tokens": args.tokens, "temperature": 0}
    ).encode()


def text_targets(fakes: FakeWorkerProcess, model: Path) -> list[Target]:
    """pdkit without a tokenizer, pdkit with the model's (`pdkit_tok`), and smg."""
    pdkit, smg = targets(["pdkit", "smg"], fakes)
    tok = targets(["pdkit"], fakes)[0]
    tok = dataclasses.replace(
        tok,
        name="pdkit_tok",
        argv=[*tok.argv, "--prompt-tokens", f"model:{model}", "--context-length", "16384"],
        policies=tok.policies + ", model tokenizer",
    )
    return [pdkit, tok, smg]


async def run_text(
    args: argparse.Namespace,
    fakes: FakeWorkerProcess,
    router_cpu: int | None,
    loadgen_cpu: int | None,
) -> dict[str, dict[str, LoadResult]]:
    """Every text workload on every text target, in interleaved rounds; per target and
    workload, the summed throughput phases (`cpu["router"]` the router's CPU seconds)."""
    model = tokenizer_model(LOG_DIR / "tiny-tokenizer")
    loads = {w: bodies(w, args) for w in WORKLOADS}
    paths = {w: "/v1/completions" for w in WORKLOADS} | {"chat": "/v1/chat/completions"}
    results: dict[str, dict[str, LoadResult]] = {}
    running = []
    try:
        for target in text_targets(fakes, model):
            print(f"[{target.name}] starting (text)", flush=True)
            if await start(target, router_cpu, loadgen_cpu):
                running.append(target)
                results[target.name] = {w: LoadResult() for w in WORKLOADS}
            else:
                print(f"[{target.name}] {target.note}", flush=True)
                await stop(target)
        for round_no in range(1, args.rounds + 1):
            for workload in WORKLOADS:
                for target in running:
                    assert target.proc is not None
                    part = await closed_loop(
                        target.port,
                        loads[workload],
                        args.concurrency,
                        seconds=args.seconds / args.rounds,
                        watch={"router": target.proc.pid},
                        path=paths[workload],
                    )
                    total = results[target.name][workload]
                    total.done += part.done
                    total.errors += part.errors
                    total.seconds += part.seconds
                    total.cpu["router"] = total.cpu.get("router", 0.0) + part.cpu["router"]
            print(f"text round {round_no}/{args.rounds} done", flush=True)
    finally:
        for target in running:
            await stop(target)
    return results


def report_text(results: dict[str, dict[str, LoadResult]], args: argparse.Namespace) -> None:
    print()
    print(
        f"text workloads (non-streaming, {args.concurrency} clients, {args.tokens} tokens each): "
        f"chat = a ~{args.system_tokens}-token shared system prompt + a short user message; "
        f"completions = one ~{args.system_tokens}-token prompt of its own; completions_shared = "
        "the chat's two as one prompt"
    )
    print(f"  {'target':11} {'workload':18} {'req/s':>8} {'cpu ms/req':>10} {'errors':>6}")
    for name, modes in results.items():
        for workload, m in modes.items():
            cpu = m.cpu.get("router", 0.0)
            per = f"{cpu / m.done * 1000:10.3f}" if m.done else f"{'-':>10}"
            print(f"  {name:11} {workload:18} {m.rate:8.0f} {per} {m.errors:6d}")
    if "smg" not in results:
        return
    print("  pdkit / smg, same run (throughput x, CPU per request x; CPU < 1.0 is ahead):")
    for name in ("pdkit", "pdkit_tok"):
        if name not in results:
            continue
        for workload in WORKLOADS:
            ours, theirs = results[name][workload], results["smg"][workload]
            if not ours.done or not theirs.done:
                continue
            rate = ours.rate / max(theirs.rate, 1e-9)
            cpu = (ours.cpu["router"] / ours.done) / (theirs.cpu["router"] / theirs.done)
            print(f"    {name:10} {workload:18} throughput x{rate:.2f}, CPU per request x{cpu:.2f}")
