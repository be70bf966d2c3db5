"""Once, by hand (not in the suite): does pdkit's KV-event index agree with what real SGLang
0.5.23 on this machine's CPU has cached?

`pdkit up` of a copy of topologies/local-sglang.yaml with two prefills publishing KV events
(`prefill.kv_events`) and the router on `cache_aware`; then a shared-prefix workload of
`/generate` requests with `input_ids` (the router holds no tokenizer for real SGLang). For each
request the router's prediction (`X-PDKit-Cached-Predicted`) is compared with the prefill's own
count (the `cached_tokens` of its meta_info, which the router reads from the prefill leg), and
the router's /metrics give its totals. One raw batch a prefill published is saved for the wire
format's oracle (tests/oracles/sglang_kv_events.json).

`--workload chat`: multi-turn chats instead (/v1/chat/completions, non-streaming): `--groups`
system prompts of `--prefix-tokens` tokens, each shared by `--questions` conversations of
`--turns` turns, every turn repeating the history with the model's previous answer. The router
tokenizes them with the model's chat template (the Plan gives it `--prompt-tokens model:PATH`);
the prefills run `--enable-cache-report` so that their chat answers carry `cached_tokens`. Each
answer's `usage.prompt_tokens` is compared with the router's own count (`ModelTokenizer`).

    .venv/bin/python -m benchmarks.real_kv_events [--groups 6] [--questions 5] [--oracle PATH]
        [--workload ids|chat] [--turns 3]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import yaml
import zmq

from benchmarks.lbbench.prompt_cpu import WORDS
from kit.lb.tokenizer import ModelTokenizer
from tests.support.ports import free_ports
from tests.support.real_sglang import sglang_python, tiny_model, write_topology

REPO = Path(__file__).resolve().parent.parent


def run_pdkit(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`pdkit ARGS` from the repository root, its output kept."""
    return subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def post(url: str, body: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return answer.status, dict(answer.headers), json.loads(answer.read())


def capture(port: int, out: list[list[bytes]], stop: threading.Event) -> None:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 500)
    sub.connect(f"tcp://127.0.0.1:{port}")
    while not stop.is_set():
        try:
            out.append(sub.recv_multipart())
        except zmq.Again:
            continue
    sub.close(linger=0)


def chat_rows(url: str, model: Path, args: argparse.Namespace, rng: random.Random) -> list[dict]:
    """The chat workload (see the module docstring): one row per request."""
    tokenizer = ModelTokenizer.load(model)
    words = WORDS
    systems = [
        f"system {g}: " + " ".join(rng.choice(words) for _ in range(args.prefix_tokens * 5 // 7))
        for g in range(args.groups)
    ]
    chats = {
        (g, q): [{"role": "system", "content": systems[g]}]
        for g in range(args.groups)
        for q in range(args.questions)
    }
    rows = []
    for turn in range(args.turns):
        order = list(chats)
        rng.shuffle(order)
        for g, q in order:
            messages = chats[(g, q)]
            question = f"turn {turn} question {q}: " + " ".join(rng.sample(words, 6))
            messages.append({"role": "user", "content": question})
            body = {"messages": messages, "max_tokens": 4, "temperature": 0}
            status, headers, answer = post(url + "/v1/chat/completions", body)
            usage = answer.get("usage") or {}
            ids = tokenizer.chat_ids(body) or []
            rows.append(
                {
                    "group": g,
                    "question": q,
                    "turn": turn,
                    "status": status,
                    "prefill": headers.get("X-PDKit-Prefill"),
                    "predicted": headers.get("X-PDKit-Cached-Predicted"),
                    "actual_prefill": headers.get("X-PDKit-Cached-Actual"),
                    "prompt_tokens": len(ids),
                    "usage_prompt_tokens": usage.get("prompt_tokens"),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            reply = answer.get("choices", [{}])[0].get("message", {}).get("content") or ""
            messages.append({"role": "assistant", "content": reply})
            time.sleep(0.3)  # the events of this answer reach the router before the next
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--prefix-tokens", type=int, default=160)
    parser.add_argument("--oracle", type=Path, default=None)
    parser.add_argument("--workload", choices=("ids", "chat"), default="ids")
    parser.add_argument("--turns", type=int, default=3, help="chat: turns per conversation")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pdkit-real-kv-"))
    model = tiny_model(folder / "tiny-llama")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    name = f"realkv-{uuid.uuid4().hex[:6]}"
    topology, data = write_topology(folder, name, model, sglang_python())
    (kv_port,) = free_ports(1)  # and kv_port + 1, for the second prefill
    data["prefill"] |= {"count": 2, "kv_events": {"port": kv_port}}
    data["router"]["prefill_policy"] = "cache_aware"
    if args.workload == "chat":  # chat's usage carries cached_tokens only with it
        data["prefill"].setdefault("args", {})["enable-cache-report"] = True
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.monotonic()
    up = run_pdkit("up", str(topology), timeout=1500)
    print(f"pdkit up: rc {up.returncode} in {time.monotonic() - started:.0f} s")
    if up.returncode != 0:
        print(up.stdout[-4000:], up.stderr[-4000:])
        run_pdkit("down", str(topology), timeout=300)
        return 1
    frames: list[list[bytes]] = []
    stop = threading.Event()
    spy = threading.Thread(target=capture, args=(kv_port, frames, stop), daemon=True)
    spy.start()
    url = f"http://127.0.0.1:{data['router']['port']}"
    rng = random.Random(7)
    rows = []
    try:
        time.sleep(2)
        if args.workload == "chat":
            rows = chat_rows(url, model, args, rng)
        prefixes = [
            [rng.randrange(10, vocab) for _ in range(args.prefix_tokens)]
            for _ in range(args.groups)
        ]
        order = [(g, q) for q in range(args.questions) for g in range(args.groups)]
        if args.workload == "chat":
            order = []  # done above
        for g, q in order:
            ids = prefixes[g] + [rng.randrange(10, vocab) for _ in range(12)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
            status, headers, answer = post(url + "/generate", body)
            rows.append(
                {
                    "group": g,
                    "question": q,
                    "status": status,
                    "prefill": headers.get("X-PDKit-Prefill"),
                    "predicted": headers.get("X-PDKit-Cached-Predicted"),
                    "actual_prefill": headers.get("X-PDKit-Cached-Actual"),
                    "decode_meta_cached": answer.get("meta_info", {}).get("cached_tokens"),
                    "prompt_tokens": len(ids),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(0.3)  # the events of this answer reach the router before the next
        with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
            metrics = [
                line
                for line in answer.read().decode().splitlines()
                if line.startswith("pdkit_lb_kv")
            ]
        print("\n".join(metrics))
    finally:
        stop.set()
        spy.join(2)
        down = run_pdkit("down", str(topology), timeout=300)
        print(f"pdkit down: rc {down.returncode}")
    compared = [r for r in rows if r["predicted"] is not None and r["actual_prefill"] is not None]
    agreed = [r for r in compared if r["predicted"] == r["actual_prefill"]]
    print(
        f"requests {len(rows)}, with a prediction and the prefill's count {len(compared)}, "
        f"agreed {len(agreed)} ({len(agreed) / max(len(compared), 1):.1%})"
    )
    counted = [r for r in rows if r.get("usage_prompt_tokens") is not None]
    if counted:
        same = [r for r in counted if r["usage_prompt_tokens"] == r["prompt_tokens"]]
        print(
            f"prompt tokens: the router's count equals SGLang's usage on {len(same)}/{len(counted)}"
        )
    if args.oracle is not None and frames:
        sample = next((f for f in frames if len(f[2]) < 4000), frames[0])
        args.oracle.write_text(
            json.dumps(
                {
                    "source": "SGLang 0.5.23 on CPU, a PD prefill with --kv-events-config "
                    f'{{"publisher":"zmq","endpoint":"tcp://*:{kv_port}","topic":"kv"}}, '
                    "after one /generate (benchmarks/real_kv_events.py)",
                    "frames_hex": [part.hex() for part in sample],
                },
                indent=1,
            )
            + "\n"
        )
        print(f"oracle: {args.oracle} ({len(frames)} batches seen)")
    (folder / "rows.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
