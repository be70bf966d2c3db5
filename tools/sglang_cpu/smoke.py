#!/usr/bin/env python3
"""Prove the real SGLang runs here: a colocated server and a prefill + decode pair agree.

    .venv-sglang-cpu/bin/python tools/sglang_cpu/smoke.py [--faults] [--out .pdkit/sglang-cpu-smoke]

1. Builds the tiny model (tools/tiny_model.py, seed 0) unless it is there.
2. Starts a colocated server, times launch -> /health 200, sends greedy /generate requests,
   records the answers of its info endpoints and /metrics, stops it.
3. Starts a prefill and a decode server (Mooncake over TCP), times each, sends every prompt as
   a PD router does (the same body, with bootstrap_host/port/room, to both at once), and checks
   the decode's tokens equal the colocated server's.
4. With --faults: stops the prefill (SIGSTOP), then kills it, with a request in flight each
   time, and keeps the lines the decode and prefill wrote meanwhile.
Writes report.json and the servers' logs under --out; exits 1 when the tokens differ or a
step fails. Every process it starts runs in its own session and is stopped on the way out.
Only the standard library: it runs with the SGLang venv's python (or any python 3.11).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import cpu_profile  # noqa: E402

HOST = "127.0.0.1"
PROMPTS = [
    "Hello world, this is",
    "The quick brown fox",
    "Prefill and decode run on separate servers;",
    "The quick brown fox",  # a repeat: the prefill's prefix cache is hit
    "What is the capital of France?",
]
MAX_NEW_TOKENS = 32
INFO_ENDPOINTS = [
    "/health",
    "/health_generate",
    "/get_server_info",
    "/server_info",
    "/get_load",
    "/v1/loads",
    "/v1/models",
    "/get_model_info",
    "/model_info",
]
LOG_SIGNATURES = re.compile(
    r"fired up|Uvicorn running|BootstrapServer|Transfer Engine|KVTransferError|heartbeat|Heartbeat|"
    r"[Ff]ailed|[Aa]bort|Traceback|Error",
)


class Server:
    def __init__(
        self, name: str, args: list[str], out: Path, env: dict[str, str], python: str
    ) -> None:
        self.name = name
        self.log_path = out / f"{name}.log"
        self.port = int(args[args.index("--port") + 1])
        self.url = f"http://{HOST}:{self.port}"
        self.t0 = time.monotonic()
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            ["nice", "-n", "19", python, "-m", "sglang.launch_server", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: signals reach the scheduler too
        )
        self.start_s: float | None = None

    def wait_healthy(self, timeout: float = 420) -> float:
        while time.monotonic() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; see {self.log_path}"
                )
            status, _ = http("GET", self.url + "/health", timeout=3)
            if status == 200:
                self.start_s = round(time.monotonic() - self.t0, 1)
                return self.start_s
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not healthy after {timeout} s; see {self.log_path}")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        self.signal(signal.SIGKILL)  # children that outlived their parent
        self.proc.wait()

    def log_lines(self, since: int = 0) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()[since:]


def http(method: str, url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"content-type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, f"{type(e).__name__}: {e}"


def free_ports(count: int, low: int = 42000, high: int = 42999) -> list[int]:
    """`count` ports in [low, high] that nothing holds now, from a random start.

    The range lies inside the kernel's ephemeral range (32768-60999), so a client socket of
    another program may hold any of them for a while; a prefill whose bootstrap port is taken
    still turns healthy (the bind error is only logged), hence checking just before launch.
    """
    ports: list[int] = []
    start = random.randrange(low, high + 1)
    for i in range(high - low + 1):
        port = low + (start - low + i) % (high - low + 1)
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports in {low}-{high}")


def generate_body(prompt: str) -> dict:
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True},
    }


def pd_generate(
    prefill: Server, decode: Server, bootstrap_port: int, prompt: str, timeout: float = 120
) -> dict:
    """What a PD router does: one body, bootstrap fields added, to prefill and decode at once."""
    body = generate_body(prompt) | {
        "bootstrap_host": HOST,
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": random.getrandbits(63),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p = pool.submit(http, "POST", prefill.url + "/generate", body, timeout)
        d = pool.submit(http, "POST", decode.url + "/generate", body, timeout)
        (ps, pbody), (ds, dbody) = p.result(), d.result()
    return {
        "prefill_status": ps,
        "prefill_body": pbody[:600],
        "decode_status": ds,
        "decode_body": dbody[:2000],
    }


def output_ids(text: str) -> list[int] | None:
    try:
        return json.loads(text)["output_ids"]
    except (ValueError, KeyError, TypeError):
        return None


def probe_endpoints(server: Server) -> dict:
    out = {}
    for path in INFO_ENDPOINTS:
        status, text = http("GET", server.url + path, timeout=10)
        try:
            shape: object = json.loads(text)
        except ValueError:
            shape = text[:300]
        out[path] = {"status": status, "body": shape}
    status, text = http("GET", server.url + "/metrics", timeout=10)
    names = sorted({m.group(1) for m in re.finditer(r"^# TYPE (\S+) (\S+)", text, re.M)})
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)", text, re.M))
    out["/metrics"] = {
        "status": status,
        "metrics": {n: types[n] for n in names},
        "sample": text[:4000],
    }
    return out


def probe_openai(server: Server, model: str) -> dict:
    """The OpenAI routes on the tiny model: its chat template must render, greedy must work."""
    out = {}
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello world"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    completion = {
        "model": model,
        "prompt": "The quick brown fox",
        "max_tokens": 8,
        "temperature": 0,
    }
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        status, text = http("POST", server.url + path, body)
        try:
            out[path] = {"status": status, "body": json.loads(text)}
        except ValueError:
            out[path] = {"status": status, "body": text[:500]}
    return out


def signature_lines(lines: list[str]) -> list[str]:
    return [line[:400] for line in lines if LOG_SIGNATURES.search(line)][:40]


def ensure_model(model: Path, python: str) -> None:
    if (model / "config.json").exists():
        return
    subprocess.run(
        [
            "nice",
            "-n",
            "19",
            python,
            str(REPO / "tools" / "tiny_model.py"),
            "--out",
            str(model),
            "--seed",
            "0",
        ],
        check=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".pdkit" / "sglang-cpu-smoke")
    ap.add_argument("--model", type=Path, default=REPO / ".pdkit" / "tiny-model-seed0")
    ap.add_argument("--python", default=sys.executable, help="the SGLang venv's python")
    ap.add_argument("--ports", default="42000-42999", help="range to pick free ports from")
    ap.add_argument(
        "--faults", action="store_true", help="also provoke KV-transfer failures (SIGSTOP, kill)"
    )
    ap.add_argument("--skip-plain", action="store_true")
    args = ap.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ensure_model(args.model, args.python)
    low, high = (int(x) for x in args.ports.split("-"))
    env = dict(os.environ) | cpu_profile.env()
    if args.faults:  # fail in-flight requests in seconds, not SGLang's default 300 s
        env |= {
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "20",
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20",
        }
    common = [
        "--model-path",
        str(args.model),
        "--host",
        HOST,
        *cpu_profile.server_flags(),
        "--enable-metrics",
    ]
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "prompts": PROMPTS,
        "max_new_tokens": MAX_NEW_TOKENS,
    }
    servers: list[Server] = []
    ok = True
    try:
        reference: list[list[int] | None] = []
        if not args.skip_plain:
            port, nccl = free_ports(2, low, high)
            plain = Server(
                "plain",
                [*common, "--port", str(port), "--nccl-port", str(nccl)],
                out,
                env,
                args.python,
            )
            servers.append(plain)
            report["plain_start_s"] = plain.wait_healthy()
            print(f"plain healthy after {plain.start_s} s", flush=True)
            for prompt in PROMPTS:
                t = time.monotonic()
                status, text = http("POST", plain.url + "/generate", generate_body(prompt))
                reference.append(output_ids(text))
                print(
                    f"  plain {prompt!r}: http {status}, {1000 * (time.monotonic() - t):.0f} ms",
                    flush=True,
                )
            report["plain_output_ids"] = reference
            report["plain_openai"] = probe_openai(plain, str(args.model))
            report["plain_endpoints"] = probe_endpoints(plain)
            report["plain_log_signatures"] = signature_lines(plain.log_lines())
            plain.stop()

        boot, p_port, d_port, p_nccl, d_nccl = free_ports(5, low, high)
        report["pd_ports"] = {"bootstrap": boot, "prefill": p_port, "decode": d_port}
        pd = [
            *common,
            "--disaggregation-transfer-backend",
            "mooncake",
            "--disaggregation-bootstrap-port",
            str(boot),
        ]
        prefill = Server(
            "prefill",
            [
                *pd,
                "--port",
                str(p_port),
                "--nccl-port",
                str(p_nccl),
                "--disaggregation-mode",
                "prefill",
            ],
            out,
            env,
            args.python,
        )
        decode = Server(
            "decode",
            [
                *pd,
                "--port",
                str(d_port),
                "--nccl-port",
                str(d_nccl),
                "--disaggregation-mode",
                "decode",
                *cpu_profile.decode_flags(),
            ],
            out,
            env,
            args.python,
        )
        servers += [prefill, decode]
        report["prefill_start_s"] = prefill.wait_healthy()
        report["decode_start_s"] = decode.wait_healthy()
        print(
            f"prefill healthy after {prefill.start_s} s, decode after {decode.start_s} s "
            "(launched together)",
            flush=True,
        )
        pd_ids = []
        for prompt in PROMPTS:
            t = time.monotonic()
            r = pd_generate(prefill, decode, boot, prompt)
            ms = 1000 * (time.monotonic() - t)
            pd_ids.append(output_ids(r["decode_body"]))
            status = f"prefill http {r['prefill_status']}, decode http {r['decode_status']}"
            print(f"  pd {prompt!r}: {status}, {ms:.0f} ms", flush=True)
            report.setdefault("pd_first_answer", r)
        report["pd_output_ids"] = pd_ids
        if reference:
            report["tokens_equal"] = equal = pd_ids == reference and None not in reference
            ok &= equal
            verdict = "EQUAL" if equal else "DIFFER"
            shape = f"{len(PROMPTS)} prompts x {MAX_NEW_TOKENS} tokens"
            print(f"PD tokens {verdict} to the colocated server's ({shape})", flush=True)
        report["prefill_endpoints"] = probe_endpoints(prefill)
        report["decode_endpoints"] = probe_endpoints(decode)
        report["prefill_log_signatures"] = signature_lines(prefill.log_lines())
        report["decode_log_signatures"] = signature_lines(decode.log_lines())

        if args.faults:
            report["faults"] = faults(prefill, decode, boot)
    except Exception as e:  # report what we have, then fail
        report["error"] = repr(e)
        print(f"FAILED: {e!r}", flush=True)
        ok = False
    finally:
        for s in servers:
            s.stop()
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {out / 'report.json'}", flush=True)
    sys.exit(0 if ok else 1)


def faults(prefill: Server, decode: Server, boot: int) -> dict:
    result = {}
    for kind, sig in (("sigstop", signal.SIGSTOP), ("kill", signal.SIGKILL)):
        marks = len(prefill.log_lines()), len(decode.log_lines())
        t = time.monotonic()
        prefill.signal(sig)
        r = pd_generate(prefill, decode, boot, "The quick brown fox jumps", timeout=60)
        waited = round(time.monotonic() - t, 1)
        time.sleep(12)  # heartbeats: SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL 5 s x MAX_FAILURE 2
        result[kind] = {
            "request": r,
            "seconds": waited,
            "decode_lines": signature_lines(decode.log_lines(marks[1])),
            "prefill_lines": signature_lines(prefill.log_lines(marks[0])),
            "decode_health": http("GET", decode.url + "/health", timeout=5),
        }
        print(f"  fault {kind}: decode http {r['decode_status']} after {waited} s", flush=True)
        if kind == "sigstop":
            prefill.signal(signal.SIGCONT)
            time.sleep(3)
            after = pd_generate(prefill, decode, boot, "The quick brown fox", timeout=60)
            result["after_sigcont"] = {
                "prefill_status": after["prefill_status"],
                "decode_status": after["decode_status"],
                "decode_body": after["decode_body"][:300],
            }
    return result


if __name__ == "__main__":
    main()
