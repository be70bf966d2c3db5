"""`make bench-lb`: pdkit's PD load balancer against sglang-router's mini_lb, smg, and no router.

The same load goes to each target in one run, in front of the same fake PD workers:
- `direct`: straight to one decode worker (the floor: no routing at all);
- `pdkit`: `python -m kit.lb` (this repo), default policies;
- `mini_lb`: `python -m sglang_router.launch_router --pd-disaggregation --mini-lb` (0.3.2);
- `smg`: `smg launch --pd-disaggregation` (1.13.0), default policies.

Fairness on a shared 2-core machine: each router is pinned to CPU 1 (only the one under test is
busy); the fake workers (a separate, lightweight process: raw asyncio HTTP, no parsing beyond
what routing needs) and this load generator share CPU 0. Targets are measured in interleaved
rounds so that they all see the same background noise. Results are ratios against the direct
path and between routers in the same run, never absolute targets.

For each target and for non-streaming and streaming `/generate` (`--tokens` events per stream):
- throughput: `--concurrency` clients in a closed loop for `--seconds`: requests/s, and the
  router's CPU time per request (/proc/PID/stat utime + stime, all threads, over exactly the
  measured window), whose inverse is the requests one whole core would serve;
- added latency: `--latency-requests` arriving at `--latency-rate`/s (Poisson, open loop, far
  below every router's capacity): p50/p99 of end-to-end latency (non-streaming) or time to the
  first chunk (streaming), minus the direct path's.

Venvs: PDKIT_SGLANG_ROUTER_PYTHON (default .venv-sglang-router/bin/python) and PDKIT_SMG
(default .venv-smg/bin/smg); a target whose venv is missing is skipped with a note. Router logs
go to .bench/lb/NAME.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kit.lb.config import DEFAULT_DECODE_POLICY, DEFAULT_PREFILL_POLICY
from kit.sim.launch import free_port
from kit.topology import ports

REPO = Path(__file__).resolve().parent.parent
LOG_DIR = REPO / ".bench" / "lb"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# -- fake PD workers: one process, raw asyncio HTTP/1.1 ------------------------------------------

_SERVER_INFO = json.dumps(
    {
        "version": "bench-fake",
        "disaggregation_mode": "null",
        "internal_states": [{"last_gen_throughput": 0.0}],
        "model_path": "bench-model",
        "served_model_name": "bench-model",
    }
)
_MODEL_INFO = json.dumps(
    {
        "model_path": "bench-model",
        "tokenizer_path": None,
        "is_generation": True,
        "served_model_name": "bench-model",
    }
)
_MODELS = json.dumps(
    {
        "object": "list",
        "data": [{"id": "bench-model", "object": "model", "created": 0, "owned_by": "bench"}],
    }
)


def header_int(lower_head: bytes, name: bytes) -> int:
    """An integer header from a lower-cased header block (0 when absent)."""
    pos = lower_head.find(name)
    if pos < 0:
        return 0
    end = lower_head.find(b"\r\n", pos)
    return int(lower_head[pos + len(name) : end if end >= 0 else None])


def _event(k: int) -> bytes:
    text = "".join(f" t{i}" for i in range(k + 1))
    body = json.dumps(
        {
            "text": text,
            "meta_info": {"id": "bench", "completion_tokens": k + 1, "finish_reason": None},
        }
    )
    return b"data: " + body.encode() + b"\n\n"


class WorkerProtocol(asyncio.Protocol):
    """One connection to a fake worker: keep-alive, Content-Length bodies, chunked SSE out."""

    def __init__(self, role: str, tokens: int, token_delay: float, log: bool) -> None:
        self.role = role
        self.tokens = tokens
        self.token_delay = token_delay
        self.log = log
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        n = tokens if role == "decode" else 1
        self.unary = json.dumps(
            {
                "text": "".join(f" t{i}" for i in range(n)),
                "meta_info": {
                    "id": "bench",
                    "prompt_tokens": 48,
                    "completion_tokens": n,
                    "finish_reason": {"type": "length"},
                },
            }
        ).encode()
        self.events = [_event(k) for k in range(n)]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._parse()

    def _parse(self) -> None:
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            lower = head.lower()
            length = header_int(lower, b"content-length:")
            if b"transfer-encoding: chunked" in lower:
                self._send(411, b"chunked request bodies are not supported", close=True)
                return
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            line = head.split(b"\r\n", 1)[0].split(b" ")
            method, path = line[0], line[1].split(b"?")[0]
            close = b"connection: close" in lower
            if self.log:
                print(f"{self.role} {method.decode()} {path.decode()}", file=sys.stderr)
            self._route(method, path, body, close)

    def _route(self, method: bytes, path: bytes, body: bytes, close: bool) -> None:
        if method == b"POST" and path in (
            b"/generate",
            b"/v1/completions",
            b"/v1/chat/completions",
        ):
            if b'"stream":true' in body or b'"stream": true' in body:
                self.busy = True
                asyncio.get_running_loop().create_task(self._stream(close))
            else:
                self._send(200, self.unary, close=close)
        elif path in (b"/health", b"/health_generate", b"/liveness", b"/readiness", b"/ready"):
            self._send(200, b"", close=close, content_type=b"text/plain")
        elif path in (b"/server_info", b"/get_server_info"):
            self._send(200, _SERVER_INFO.encode(), close=close)
        elif path in (b"/model_info", b"/get_model_info"):
            self._send(200, _MODEL_INFO.encode(), close=close)
        elif path == b"/v1/models":
            self._send(200, _MODELS.encode(), close=close)
        elif path == b"/get_load":
            self._send(200, b'{"load": 0}', close=close)
        elif path == b"/flush_cache":
            self._send(200, b"", close=close, content_type=b"text/plain")
        else:
            self._send(404, b'{"error": "not found"}', close=close)

    def _send(
        self, status: int, body: bytes, *, close: bool, content_type: bytes = b"application/json"
    ) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        reason = {200: b"OK", 404: b"Not Found", 411: b"Length Required"}.get(status, b"X")
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            status,
            reason,
            content_type,
            len(body),
            b"Connection: close\r\n" if close else b"",
        )
        self.transport.write(head + body)
        if close:
            self.transport.close()

    async def _stream(self, close: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n%s\r\n" % (b"Connection: close\r\n" if close else b"")
        )
        for i, event in enumerate(self.events):
            if i and self.token_delay:
                await asyncio.sleep(self.token_delay)
            if transport.is_closing():
                return
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        done = b"data: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        if close:
            transport.close()
            return
        self.busy = False
        if self.buf:
            self._parse()


async def serve_workers(
    specs: list[tuple[str, int]], tokens: int, token_delay: float, log: bool
) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for role, port in specs:
        servers.append(
            await loop.create_server(
                lambda role=role: WorkerProtocol(role, tokens, token_delay, log),  # type: ignore[misc]
                "127.0.0.1",
                port,
                backlog=4096,
                reuse_address=True,
            )
        )
    print("ready", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


# -- load generator: raw asyncio HTTP/1.1 client, keep-alive --------------------------------------


class Connection:
    """One keep-alive client connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, float | None, int]:
        """Send one request and read the whole answer.

        Returns (status, time the first body chunk arrived or None, SSE events received).
        """
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        first: float | None = None
        events = 0
        if b"transfer-encoding: chunked" in lower:
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data = await reader.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter()
                events += data.count(b"data:")
        else:
            data = await reader.readexactly(header_int(lower, b"content-length:"))
            events = data.count(b"data:")
        if b"connection: close" in lower:
            await self.close()
        return status, first, events

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def http_request(host: str, port: int, body: bytes) -> bytes:
    return (
        b"POST /generate HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body)
    )


@dataclass
class LoadResult:
    """One load phase: completed requests, errors, wall time (s), latencies and, for streams,
    times to the first chunk (s)."""

    done: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    cpu: float = 0.0  # CPU seconds of the router over the phase (throughput phases)

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def pct(self, q: float, first: bool = False) -> float:
        """Percentile `q` (0-100) of the latency (or time to first chunk), seconds."""
        values = self.firsts if first else self.latencies
        if not values:
            return float("nan")
        data = sorted(values)
        return data[min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))]


def _record(
    result: LoadResult, started: float, answer: tuple[int, float | None, int], events: int
) -> None:
    status, first, got = answer
    if status == 200 and (not events or got == events):
        result.done += 1
        result.latencies.append(time.perf_counter() - started)
        if first is not None:
            result.firsts.append(first - started)
    else:
        result.errors += 1


async def _ask(conn: Connection, raw: bytes) -> tuple[int, float | None, int]:
    try:
        return await conn.request(raw)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        await conn.close()
        return 0, None, 0


async def closed_loop(
    port: int,
    body: bytes,
    concurrency: int,
    *,
    seconds: float,
    events: int = 0,
    pid: int | None = None,
    warmup: float = 0.3,
) -> LoadResult:
    """Throughput: `concurrency` clients, each sending the next request when the last is
    answered, for `seconds` after a warm-up. With `pid`, `cpu` is that process tree's CPU time
    over exactly the measured window.

    An answer counts as an error unless its status is 200 and, when `events` > 0, it carried
    exactly that many SSE events (the tokens and `[DONE]`).
    """
    raw = http_request("127.0.0.1", port, body)
    result = LoadResult()
    connections = [Connection("127.0.0.1", port) for _ in range(concurrency)]
    stop_at = time.perf_counter() + warmup + seconds
    measuring = False

    async def client(conn: Connection) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            answer = await _ask(conn, raw)
            if measuring:
                _record(result, started, answer, events)

    tasks = [asyncio.create_task(client(c)) for c in connections]
    await asyncio.sleep(warmup)
    measuring = True
    cpu_before = cpu_tree_seconds(pid) if pid else 0.0
    begun = time.perf_counter()
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - begun
    result.cpu = cpu_tree_seconds(pid) - cpu_before if pid else 0.0
    for conn in connections:
        await conn.close()
    return result


async def open_loop(
    port: int, body: bytes, rate: float, count: int, *, events: int = 0, seed: int = 1
) -> LoadResult:
    """Latency: `count` requests at Poisson arrivals of `rate` per second, each on a free
    keep-alive connection, whether or not earlier ones are done (no queueing in the client)."""
    raw = http_request("127.0.0.1", port, body)
    result = LoadResult()
    idle: list[Connection] = []
    rng = random.Random(seed)

    async def one() -> None:
        conn = idle.pop() if idle else Connection("127.0.0.1", port)
        started = time.perf_counter()
        answer = await _ask(conn, raw)
        _record(result, started, answer, events)
        idle.append(conn)

    tasks = []
    begun = due = time.perf_counter()
    for _ in range(count):
        due += rng.expovariate(rate)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    result.seconds = time.perf_counter() - begun
    for conn in idle:
        await conn.close()
    return result


# -- targets ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads, and its waited-for children), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def cpu_tree_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (a launcher may exec a child)."""
    total = 0.0
    todo = [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(current)
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
    return total


@dataclass
class Target:
    name: str
    argv: list[str]
    port: int
    ready_path: str
    policies: str
    proc: asyncio.subprocess.Process | None = None
    note: str = ""


def targets(names: Sequence[str], prefill: list[int], decode: list[int]) -> list[Target]:
    """The routers (and the direct path) to run, with their command lines."""
    py_router = os.environ.get(
        "PDKIT_SGLANG_ROUTER_PYTHON", str(REPO / ".venv-sglang-router/bin/python")
    )
    smg = os.environ.get("PDKIT_SMG", str(REPO / ".venv-smg/bin/smg"))
    workers: list[str] = []
    for i, port in enumerate(prefill):
        workers += ["--prefill", f"http://127.0.0.1:{port}", str(ports.BOOTSTRAP + i)]
    for port in decode:
        workers += ["--decode", f"http://127.0.0.1:{port}"]
    out = []
    for name in names:
        port = free_port()
        common = [*workers, "--host", "127.0.0.1", "--port", str(port)]
        if name == "direct":
            out.append(Target(name, [], decode[0], "", "-"))
        elif name == "pdkit":
            out.append(
                Target(
                    name,
                    [sys.executable, "-m", "kit.lb", *common, "--log-level", "warning"],
                    port,
                    "/readiness",
                    f"{DEFAULT_PREFILL_POLICY}/{DEFAULT_DECODE_POLICY}",
                )
            )
        elif name == "mini_lb":
            out.append(
                Target(
                    name,
                    [
                        py_router,
                        "-m",
                        "sglang_router.launch_router",
                        "--pd-disaggregation",
                        "--mini-lb",
                        *common,
                    ],
                    port,
                    "/health",
                    "random/random (only choice)",
                )
            )
        elif name == "smg":
            out.append(
                Target(
                    name,
                    [
                        smg,
                        "launch",
                        "--pd-disaggregation",
                        *common,
                        "--prometheus-host",
                        "127.0.0.1",
                        "--prometheus-port",
                        str(free_port()),
                        "--log-level",
                        "warn",
                    ],
                    port,
                    "/readiness",
                    "defaults (cache_aware)",
                )
            )
        else:
            raise SystemExit(f"unknown target {name!r}: use direct, pdkit, mini_lb, smg")
    return out


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


async def start(target: Target, router_cpu: int | None, loadgen_cpu: int | None) -> bool:
    """Start a router pinned to `router_cpu` and wait until it is ready; False if it cannot."""
    if not target.argv:
        return True
    if not Path(target.argv[0]).exists():
        target.note = f"skipped: {target.argv[0]} not found (make bench-lb creates it)"
        return False
    log = LOG_DIR / f"{target.name}.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    _pin(router_cpu)  # the child inherits the mask; this process goes back right after
    try:
        with log.open("wb") as sink:
            target.proc = await asyncio.create_subprocess_exec(
                *target.argv,
                cwd=REPO,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )
    finally:
        _pin(loadgen_cpu)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if target.proc.returncode is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            target.note = f"failed to start ({log}): {tail[0]}"
            return False
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
            writer.write(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                % target.ready_path.encode()
            )
            head = await reader.readuntil(b"\r\n")
            writer.close()
            if int(head[9:12]) == 200:
                return True
        await asyncio.sleep(0.2)
    target.note = "not ready within 60 s"
    return False


async def stop(target: Target) -> None:
    proc = target.proc
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One target, one mode, summed over rounds: throughput and latency phases, router CPU (s)."""

    throughput: LoadResult = field(default_factory=LoadResult)
    latency: LoadResult = field(default_factory=LoadResult)
    cpu: float = 0.0

    @property
    def cpu_per_request(self) -> float | None:
        return self.cpu / self.throughput.done if self.cpu and self.throughput.done else None

    def add(self, throughput: LoadResult, latency: LoadResult, cpu: float) -> None:
        for total, part in ((self.throughput, throughput), (self.latency, latency)):
            total.done += part.done
            total.errors += part.errors
            total.seconds += part.seconds
            total.latencies += part.latencies
            total.firsts += part.firsts
        self.cpu += cpu


async def measure_round(
    target: Target, body: bytes, args: argparse.Namespace, stream: bool, into: Measured
) -> None:
    """One round for one target and mode: a throughput phase, then a latency phase."""
    concurrency = args.stream_concurrency if stream else args.concurrency
    events = args.tokens + 1 if stream else 0
    pid = target.proc.pid if target.proc is not None else None
    throughput = await closed_loop(
        target.port,
        body,
        concurrency,
        seconds=args.seconds / args.rounds,
        events=events,
        pid=pid,
    )
    latency = await open_loop(
        target.port,
        body,
        args.latency_rate,
        max(args.latency_requests // args.rounds, 1),
        events=events,
        seed=len(into.latency.latencies) + 1,
    )
    into.add(throughput, latency, throughput.cpu)


def _request_body(stream: bool, tokens: int) -> bytes:
    prompt = ("You are a helpful assistant. Answer briefly. " * 4) + "What is PD disaggregation?"
    return json.dumps(
        {
            "text": prompt,
            "stream": stream,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0},
        }
    ).encode()


# Added latencies smaller than this (s) are within the noise of a shared machine.
NOISE_FLOOR = 0.00005


def added(m: Measured, base: Measured | None, q: float, stream: bool) -> float:
    """Latency added over the direct path at percentile `q` (s): end to end for plain requests,
    time to the first chunk for streams (the whole stream is paced by the worker's tokens)."""
    if base is None:
        return float("nan")
    return m.latency.pct(q, first=stream) - base.latency.pct(q, first=stream)


def ratio_text(ours: float, theirs: float) -> str:
    if theirs < NOISE_FLOOR:
        return f"n/a (theirs {theirs * 1000:.3f} ms is within noise; ours {ours * 1000:.3f} ms)"
    return f"{max(ours, 0.0) / theirs:.2f}x theirs"


def report(
    results: dict[str, dict[bool, Measured]],
    notes: dict[str, str],
    policies: dict[str, str],
    args: argparse.Namespace,
    pinned: bool,
) -> None:
    direct = results.get("direct")
    print()
    print(
        f"pdkit lb bench: {args.prefills} prefill + {args.decodes} decode fake workers, "
        f"{args.tokens} tokens per request (streams: one event per token, "
        f"{args.token_delay * 1000:g} ms apart)"
    )
    print(
        "router pinned alone to CPU 1; workers and load generator on CPU 0"
        if pinned
        else "nothing pinned (--no-pin or fewer than 2 CPUs): routers share CPUs with the load"
    )
    print(
        f"throughput: {args.concurrency} (streams {args.stream_concurrency}) clients, "
        f"{args.seconds:g} s per target and mode; latency: {args.latency_requests} requests "
        f"arriving at {args.latency_rate:g}/s (open loop); {args.rounds} interleaved rounds"
    )
    print("+ms = added over direct: end to end (non-streaming), time to first chunk (streaming)")
    print(
        "req/s is bounded by the CPU share the router got (cpu busy: other tenants of a shared "
        "machine take the rest);\nreq/cpu-s = requests per second of one whole core "
        "(1 / cpu ms/req), which that noise does not move"
    )
    for stream in (False, True):
        base = direct[stream] if direct else None
        print()
        print("streaming" if stream else "non-streaming")
        lat = "ttft" if stream else "e2e"
        print(
            f"  {'target':8} {'req/s':>8} {'x direct':>8} {lat + ' p50':>9} {lat + ' p99':>9} "
            f"{'+ms p50':>8} {'+ms p99':>8} {'cpu ms/req':>10} {'cpu busy':>8} "
            f"{'req/cpu-s':>9} {'errors':>6}  policies"
        )
        for name, modes in results.items():
            m = modes[stream]
            rate = m.throughput.rate
            ratio = rate / base.throughput.rate if base and base.throughput.rate else float("nan")
            is_direct = name == "direct"
            add50 = 0.0 if is_direct else added(m, base, 50, stream)
            add99 = 0.0 if is_direct else added(m, base, 99, stream)
            per_req = m.cpu_per_request
            cpu = f"{per_req * 1000:10.3f}" if per_req is not None else f"{'-':>10}"
            busy = (
                f"{m.cpu / m.throughput.seconds * 100:7.0f}%"
                if per_req is not None and m.throughput.seconds
                else f"{'-':>8}"
            )
            errors = m.throughput.errors + m.latency.errors
            capacity = f"{1 / per_req:9.0f}" if per_req else f"{'-':>9}"
            print(
                f"  {name:8} {rate:8.0f} {ratio:8.2f} {m.latency.pct(50, stream) * 1000:9.2f} "
                f"{m.latency.pct(99, stream) * 1000:9.2f} {add50 * 1000:8.2f} {add99 * 1000:8.2f} "
                f"{cpu} {busy} {capacity} {errors:6d}  {policies[name]}"
            )
    for name, note in notes.items():
        print(f"  {name}: {note}")
    pdkit = results.get("pdkit")
    if pdkit is None:
        return
    print()
    print("ratios (pdkit against the others, same run)")
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        p = pdkit[stream]
        base = direct[stream] if direct else None
        for other in ("mini_lb", "smg"):
            if other not in results:
                continue
            o = results[other][stream]
            parts = [f"throughput x{p.throughput.rate / max(o.throughput.rate, 1e-9):.2f}"]
            if p.cpu_per_request and o.cpu_per_request:
                parts[0] += f" (x{o.cpu_per_request / p.cpu_per_request:.2f} per CPU-second)"
            if base is not None:
                ours, theirs = added(p, base, 99, stream), added(o, base, 99, stream)
                parts.append(f"added p99 {ratio_text(ours, theirs)}")
            print(f"  {kind:13} vs {other:7}: " + ", ".join(parts))


async def run(args: argparse.Namespace) -> int:
    pinned = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    router_cpu, loadgen_cpu = (1, 0) if pinned else (None, None)
    prefill = [free_port() for _ in range(args.prefills)]
    decode = [free_port() for _ in range(args.decodes)]
    specs = ",".join([f"prefill:{p}" for p in prefill] + [f"decode:{p}" for p in decode])
    _pin(loadgen_cpu)
    workers = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.bench_lb",
        "--serve-workers",
        specs,
        "--tokens",
        str(args.tokens),
        "--token-delay",
        str(args.token_delay),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    notes: dict[str, str] = {}
    running: list[Target] = []
    all_targets = targets(args.targets, prefill, decode)
    policies = {t.name: t.policies for t in all_targets}
    results: dict[str, dict[bool, Measured]] = {}
    try:
        if workers.stdout is None or await workers.stdout.readline() != b"ready\n":
            raise SystemExit("the fake workers did not start")
        for target in all_targets:
            print(f"[{target.name}] starting", flush=True)
            if await start(target, router_cpu, loadgen_cpu):
                running.append(target)
                results[target.name] = {False: Measured(), True: Measured()}
            else:
                notes[target.name] = target.note
                print(f"[{target.name}] {target.note}", flush=True)
                await stop(target)
        # Interleaved rounds: every target sees the same background noise of a shared machine.
        for round_no in range(1, args.rounds + 1):
            for stream in (False, True):
                body = _request_body(stream, args.tokens)
                for target in running:
                    await measure_round(target, body, args, stream, results[target.name][stream])
            print(f"round {round_no}/{args.rounds} done", flush=True)
    finally:
        for target in running:
            await stop(target)
        workers.send_signal(signal.SIGTERM)
        await workers.wait()
    report(results, notes, policies, args, pinned)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench_lb",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--targets",
        default="direct,pdkit,mini_lb,smg",
        help="comma-separated subset of direct,pdkit,mini_lb,smg",
    )
    p.add_argument("--prefills", type=int, default=2)
    p.add_argument("--decodes", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16, help="tokens (stream events) per request")
    p.add_argument(
        "--token-delay",
        type=float,
        default=0.001,
        help="seconds between streamed tokens (default 0.001)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=6.0,
        help="throughput phase length per target and mode, over all rounds (s)",
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument(
        "--latency-rate",
        type=float,
        default=200.0,
        help="arrivals per second of the latency phase (Poisson, open loop; default 200)",
    )
    p.add_argument(
        "--latency-requests",
        type=int,
        default=2000,
        help="requests of the latency phase, over all rounds (default 2000)",
    )
    p.add_argument(
        "--rounds", type=int, default=6, help="interleaved rounds over the targets (default 6)"
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--serve-workers", metavar="ROLE:PORT,...", help=argparse.SUPPRESS)
    p.add_argument("--worker-log", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up for the load generator and workers

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    if args.serve_workers:
        specs = [
            (role, int(port))
            for role, port in (item.split(":") for item in args.serve_workers.split(","))
        ]
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_workers(specs, args.tokens, args.token_delay, args.worker_log))
        return 0
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
