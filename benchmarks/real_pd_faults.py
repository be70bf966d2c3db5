"""`make bench-real-faults`, once, by hand (not in the suite: four real servers start, minutes on
2 cores): pdkit's router in front of real SGLang 0.5.23 on this machine's CPU when workers die.

`pdkit up` of a copy of topologies/local-sglang.yaml with two prefills and two decodes, the
router's request checks off (`router.args: {no-validate: true}`, so that SGLang itself sees what
it would crash on), supervisord restarting what dies. Then:

1. a greedy chat stream (/v1/chat/completions, `ignore_eos`, usage asked) run unbroken, then
   again with the decode serving it SIGKILLed after `--kill-after` chunks: the router
   continues it on the other decode (bridged through /v1/completions with its ids); the
   client's text and usage must equal the unbroken run's, with no error event;
2. the poison request: `/generate` with an input id past the vocabulary (SGLang 0.5.23 dies
   on it in the embedding), sent `--poison-sends` times, each once every server is back: which
   servers died (their PIDs under supervisord changed), and each answer's status and message.
   The first kills a prefill and waits for it (a suspect goes to no other worker); the second
   goes to that prefill only, kills it again and is quarantined; the third is refused at once
   as poison. At most one server may die.

    .venv/bin/python -m benchmarks.real_pd_faults [--kill-after 8] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import yaml

from benchmarks.real_kv_events import run_pdkit
from kit.plan.resolve import resolve
from kit.topology.plan_types import Plan
from tests.support.local_deploy import pids
from tests.support.real_sglang import sglang_python, tiny_model, write_topology
from tests.support.sim_launch import healthy


def chat_stream(url: str, body: dict, kill: tuple[int, dict[str, int]] | None) -> dict:
    """One streamed chat through the router: its text, usage, chunks, errors; with `kill`
    (after how many chunks, {decode url: pid}), the decode serving it is SIGKILLed then."""
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    text, usage, chunks, errors, killed = [], None, 0, [], None
    with urllib.request.urlopen(request, timeout=300) as response:
        decode = response.headers.get("X-PDKit-Decode")
        for line in response:
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                errors.append(event["error"])
                continue
            chunks += 1
            for choice in event.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
            usage = event.get("usage") or usage
            if kill is not None and chunks == kill[0] and killed is None:
                killed = kill[1][decode]
                os.kill(killed, signal.SIGKILL)
    return {
        "text": "".join(text),
        "usage": usage,
        "chunks": chunks,
        "errors": errors,
        "decode": decode,
        "killed_pid": killed,
    }


def post(url: str, body: dict, timeout: float = 600) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def wait_healthy(plan: Plan, seconds: float) -> None:
    """Until every server answers /health (supervisord restarts what died)."""
    deadline = time.monotonic() + seconds
    while not all(healthy(w.url, 10) for w in plan.workers if w.serves_http):
        if time.monotonic() > deadline:
            raise SystemExit(f"a server did not come back in {seconds:g} s")
        time.sleep(2)


def metrics(url: str, prefix: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        page = answer.read().decode()
    return [line for line in page.splitlines() if line.startswith(prefix)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kill-after", type=int, default=8, help="chunks before the kill")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--poison-sends", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pdkit-real-faults-"))
    model = tiny_model(folder / "tiny-llama")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    name = f"realfaults-{uuid.uuid4().hex[:6]}"
    topology, data = write_topology(folder, name, model, sglang_python())
    data["prefill"]["count"] = 2
    data["decode"]["count"] = 2
    data["router"]["args"] = {"no-validate": True}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.monotonic()
    up = run_pdkit("up", str(topology), timeout=1500)
    print(f"pdkit up: rc {up.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    if up.returncode != 0:
        print(up.stdout[-4000:], up.stderr[-4000:])
        run_pdkit("down", str(topology), timeout=300)
        return 1
    url = f"http://127.0.0.1:{data['router']['port']}"
    plan = resolve(topology)
    decodes = {d.url: d.name for d in plan.role("decode")}
    servers = [w.name for w in plan.workers if w.serves_http]
    ok = True
    try:
        body = {
            "model": data["model"]["served_name"],
            "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        unbroken = chat_stream(url, body, None)
        running = pids(topology, name)
        by_url = {u: running[n] for u, n in decodes.items()}
        cut = chat_stream(url, body, (args.kill_after, by_url))
        same = cut["text"] == unbroken["text"] and cut["usage"] == unbroken["usage"]
        ok &= same and not cut["errors"] and cut["killed_pid"] is not None
        print(f"1. chat stream, unbroken: {json.dumps(unbroken)}")
        print(f"   chat stream, decode SIGKILLed after {args.kill_after} chunks: {json.dumps(cut)}")
        print(f"   same text and usage as unbroken: {same}; error events: {len(cut['errors'])}")
        print("   " + "; ".join(metrics(url, "pdkit_lb_migrations")))
        wait_healthy(plan, 600)  # the killed decode back before the poison part counts deaths
        before = pids(topology, name)
        poison = {"input_ids": [1, 2, vocab + 1000], "sampling_params": {"max_new_tokens": 2}}
        for n in range(args.poison_sends):
            if n:  # the dead server back first: the rule sends a suspect only to it
                wait_healthy(plan, 600)
            t0 = time.monotonic()
            status, text = post(url + "/generate", poison)
            now = pids(topology, name)
            died = [s for s in servers if before.get(s) != now.get(s)]
            print(
                f"2. poison send {n + 1}: {status} in {time.monotonic() - t0:.1f} s: {text[:400]}"
                f" | servers whose PID changed since the first send: {died or 'none'}",
                flush=True,
            )
            ok &= len(died) <= 1 and status >= 400
        ok &= "poison" in text  # the last send: refused at once as poison
        print("   " + "; ".join(metrics(url, "pdkit_lb_poison")))
    finally:
        down = run_pdkit("down", str(topology), timeout=300)
        print(f"pdkit down: rc {down.returncode}")
    print("all checks met" if ok else "a check failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
