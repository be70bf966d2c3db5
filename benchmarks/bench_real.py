"""`make bench-real`: what a PD router adds to the real SGLang 0.5.23, in one run.

One real prefill and one real decode (the tiny model on this machine's CPU, Mooncake over TCP,
kit's CPU profile: `tests.support.real_sglang`), and the same streamed greedy `/generate` sent
three ways, interleaved request by request so that every path sees the same background noise:
- `direct`: this client does what a PD router does, with nothing in between: the same body
  with the bootstrap fields to the prefill and to the decode at once, the decode's stream read;
- `pdkit`: through `python -m kit.lb` (this repo), default policies, access log on;
- `smg`: through `smg launch --pd-disaggregation` (1.13.0), default policies.

Per request: TTFT (sent to the first event with a token) and TPOT (the decode's tokens after
the first over the time they took). Requests go one at a time (no queueing: the router's own
cost, not the workers'), request `i` of a round has the same prompt on every path, and the
report gives each router's added TTFT and TPOT as the median of the paired differences
(router minus direct, same prompt, same round) beside p50/p90 of each path.

Results are differences and ratios against the direct path measured in the same run, never
absolute targets: the machine is shared and has 2 cores, which the real servers use too.
Logs and the JSON result go to .bench/real/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.ports import free_ports
from tests.support.real_sglang import RealServer, tiny_model

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".bench" / "real"
PATHS = ("direct", "pdkit", "smg")


@dataclass
class Sample:
    ttft_ms: float
    tpot_ms: float | None
    tokens: int


@dataclass
class Cluster:
    """The real pair, the routers in front of it, and the client session."""

    session: aiohttp.ClientSession
    prefill: RealServer
    decode: RealServer
    urls: dict[str, str] = field(default_factory=dict)

    async def send(self, path: str, body: dict[str, Any]) -> Sample:
        if path == "direct":
            return await _direct(self.session, self.prefill, self.decode, body)
        return await _via_router(self.session, self.urls[path], body)


@dataclass
class PathResult:
    name: str
    samples: list[Sample | None] = field(default_factory=list)  # None: failed
    errors: list[str] = field(default_factory=list)


def _body(index: int, tokens: int, prompt_len: int) -> dict[str, Any]:
    rng = random.Random(index)
    ids = [rng.randrange(8, 560) for _ in range(prompt_len)]  # the tiny vocabulary is 562
    params = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    return {"input_ids": ids, "sampling_params": params, "stream": True}


async def _read_stream(response: aiohttp.ClientResponse, sent: float) -> Sample:
    first = last = None
    first_tokens = tokens = 0
    pending = b""
    async for data in response.content.iter_any():
        now = time.perf_counter()
        *events, pending = (pending + data).split(b"\n\n")
        for event in events:
            payload = event.strip()[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"])[:200])
            count = len(chunk.get("output_ids") or ())
            if count and first is None:
                first, first_tokens = now, count
            if count:
                last, tokens = now, count
    if first is None or last is None:
        raise RuntimeError("the stream ended without a token")
    tpot = (last - first) * 1000 / (tokens - first_tokens) if tokens > first_tokens else None
    return Sample((first - sent) * 1000, tpot, tokens)


async def _via_router(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Sample:
    sent = time.perf_counter()
    async with session.post(url + "/generate", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        return await _read_stream(response, sent)


async def _direct(
    session: aiohttp.ClientSession, prefill: RealServer, decode: RealServer, body: dict[str, Any]
) -> Sample:
    pd = body | {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    sent = time.perf_counter()

    async def prefill_leg() -> None:
        async with session.post(prefill.url + "/generate", json=pd) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"prefill HTTP {response.status}")

    async def decode_leg() -> Sample:
        async with session.post(decode.url + "/generate", json=pd) as response:
            if response.status != 200:
                raise RuntimeError(f"decode HTTP {response.status}: {await response.text()}")
            return await _read_stream(response, sent)

    _, sample = await asyncio.gather(prefill_leg(), decode_leg())
    return sample


def _router_argv(name: str, prefill: RealServer, decode: RealServer, port: int) -> list[str]:
    workers = ["--prefill", prefill.url, str(prefill.bootstrap_port), "--decode", decode.url]
    common = [*workers, "--host", "127.0.0.1", "--port", str(port)]
    if name == "pdkit":
        return [sys.executable, "-m", "kit.lb", *common, "--log-level", "warning"]
    smg = os.environ.get("PDKIT_SMG", str(REPO / ".venv-smg/bin/smg"))
    metrics = free_ports(1)[0]
    return [smg, "launch", "--pd-disaggregation", *common, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics), "--log-level", "warn"]  # fmt: skip


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited ({proc.returncode}): see {OUT}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(url + "/readiness") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.3)
    raise SystemExit(f"{url} was not ready within 90 s")


def _paired_diffs(a: list[Sample | None], b: list[Sample | None], key: str) -> list[float]:
    """`key` of a minus b, request by request (same prompt, same round), where both have it."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            continue
        vx, vy = getattr(x, key), getattr(y, key)
        if vx is not None and vy is not None:
            diffs.append(vx - vy)
    return diffs


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(
    results: dict[str, PathResult], args: argparse.Namespace, start_s: dict[str, float]
) -> dict[str, Any]:
    direct = results["direct"]
    rows: list[tuple[str, dict[str, Any]]] = []
    paths: dict[str, dict[str, Any]] = {}
    for name, result in results.items():
        ok = [s for s in result.samples if s is not None]
        ttft = [s.ttft_ms for s in ok]
        tpot = [s.tpot_ms for s in ok if s.tpot_ms is not None]
        ttft_diffs = _paired_diffs(result.samples, direct.samples, "ttft_ms")
        tpot_diffs = _paired_diffs(result.samples, direct.samples, "tpot_ms")
        added_ttft, added_tpot = _pct(ttft_diffs, 0.5), _pct(tpot_diffs, 0.5)
        entry: dict[str, Any] = {
            "requests": len(result.samples),
            "failed": len(result.samples) - len(ok),
            "ttft_ms_p50": _pct(ttft, 0.5),
            "ttft_ms_p90": _pct(ttft, 0.9),
            "tpot_ms_p50": _pct(tpot, 0.5),
            "tpot_ms_p90": _pct(tpot, 0.9),
            "added_ttft_ms": None if name == "direct" else added_ttft,
            "added_tpot_ms": None if name == "direct" else added_tpot,
            # The spread of the paired differences: the noise the medians sit in.
            "added_ttft_ms_p25_p75": None
            if name == "direct"
            else [_pct(ttft_diffs, 0.25), _pct(ttft_diffs, 0.75)],
            "errors": result.errors[:5],
        }
        paths[name] = entry
        rows.append((name, entry))
    print(f"\nreal SGLang {args.prompt_len}-token prompts, {args.tokens} tokens streamed, "
          f"{args.rounds} rounds x {args.requests} requests per path, one at a time")  # fmt: skip
    print(f"server start (s): {', '.join(f'{k} {v:.0f}' for k, v in start_s.items())}")
    head = ("path", "ok/sent", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90", "+TTFT", "+TPOT")
    print("\n" + "  ".join(f"{h:>9}" for h in head))
    for name, e in rows:
        cells = (name, f"{e['requests'] - e['failed']}/{e['requests']}",
                 _fmt(e["ttft_ms_p50"]), _fmt(e["ttft_ms_p90"]), _fmt(e["tpot_ms_p50"]),
                 _fmt(e["tpot_ms_p90"]), _fmt(e["added_ttft_ms"], 3),
                 _fmt(e["added_tpot_ms"], 3))  # fmt: skip
        print("  ".join(f"{c:>9}" for c in cells))
    print("\n(ms; +TTFT/+TPOT: the median over requests of router minus direct, same prompt, "
          "same round)")  # fmt: skip
    pdkit = paths.get("pdkit", {}).get("added_ttft_ms")
    if pdkit is not None:
        verdict = "under" if pdkit < 1.0 else "over"
        low, high = paths["pdkit"]["added_ttft_ms_p25_p75"]
        print(f"pdkit's router adds {pdkit:.3f} ms TTFT (paired differences p25 {_fmt(low, 3)}, "
              f"p75 {_fmt(high, 3)} ms): {verdict} the 1 ms target")  # fmt: skip
    return {"args": vars(args), "start_s": start_s, "paths": paths}


async def run(args: argparse.Namespace) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-real-"))
    model = tiny_model(folder / "tiny-llama")
    prefill = RealServer(model, OUT, role="prefill").launch()
    decode = RealServer(model, OUT, role="decode").launch()
    routers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        start_s = {"prefill": prefill.wait_ready(), "decode": decode.wait_ready()}
        paths = [p for p in PATHS if p in args.paths]
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            cluster = Cluster(session, prefill, decode)
            urls = cluster.urls
            for name in paths:
                if name == "direct":
                    continue
                port = free_ports(1)[0]
                argv = _router_argv(name, prefill, decode, port)
                if not Path(argv[0]).exists():
                    raise SystemExit(f"{argv[0]} not found: make .venv-smg/.stamp")
                log = (OUT / f"{name}.log").open("wb")
                routers[name] = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log)
                urls[name] = f"http://127.0.0.1:{port}"
                await _wait_ready(session, urls[name], routers[name])
            results = {name: PathResult(name) for name in paths}
            for index in range(args.warmup):  # compile, caches, connections: not counted
                for name in paths:
                    await cluster.send(name, _body(-1 - index, 8, 8))
            for round_no in range(args.rounds):
                for i in range(args.requests):
                    body = _body(round_no * args.requests + i, args.tokens, args.prompt_len)
                    order = paths[i % len(paths) :] + paths[: i % len(paths)]  # who goes first
                    for name in order:
                        try:
                            sample = await cluster.send(name, body)
                        except (RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
                            results[name].errors.append(repr(exc))
                            sample = None
                        results[name].samples.append(sample)
                print(f"round {round_no + 1}/{args.rounds} done", flush=True)
        out = report(results, args, start_s)
        (OUT / "result.json").write_text(json.dumps(out, indent=2))
        print(f"\nresult: {OUT / 'result.json'}")
        return 0 if all(not r.errors for r in results.values()) else 1
    finally:
        for proc in routers.values():
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        prefill.stop()
        decode.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default=",".join(PATHS), help="comma list of direct,pdkit,smg")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=10, help="per round and path")
    ap.add_argument("--warmup", type=int, default=3, help="requests per path, not counted")
    ap.add_argument("--tokens", type=int, default=32, help="tokens streamed per request")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per request")
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if "direct" not in args.paths:
        raise SystemExit("--paths must include direct: the added TTFT is measured against it")
    bad = [p for p in args.paths if p not in PATHS]
    if bad:
        raise SystemExit(f"unknown path(s) {bad}: use {', '.join(PATHS)}")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
