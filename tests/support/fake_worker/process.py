"""Fake workers in a background process: N prefills, M decodes and K null workers, one Ledger.

    with FakeWorkerProcess(prefills=2, decodes=2, nulls=1) as fakes:
        fakes.prefills   # [(url, bootstrap_port), ...]
        fakes.decodes    # [url, ...]
        fakes.nulls      # [url, ...] (non-PD workers: a client may call them directly)
    fakes.summary        # requests served, protocol problems, paths SGLang would not serve

The child (`python -m tests.support.fake_worker`) binds free ports itself (no race between picking a
port and listening on it), prints one JSON line with its URLs when every worker listens, and
one JSON line with its summary when it stops (SIGTERM or SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kit.topology import ports
from tests.support.fake_worker.worker import FakeWorker, Ledger

REPO = Path(__file__).resolve().parents[3]
MAX_PROBLEMS = 20  # problems listed in a summary (all are counted)


@dataclass
class Summary:
    """What the fake workers of one process saw, over their whole life."""

    served: dict[str, int] = field(default_factory=dict)  # inference requests answered, by role
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS
    problem_count: int = 0
    cancelled: int = 0
    not_found: dict[str, int] = field(default_factory=dict)  # "GET /path": count


def summarize(workers: list[FakeWorker], ledger: Ledger) -> Summary:
    served: Counter[str] = Counter()
    not_found: Counter[str] = Counter()
    for worker in workers:
        served[worker.role] += sum(worker.served.values())
        not_found.update(worker.not_found)
    return Summary(
        served=dict(served),
        problems=ledger.problems[:MAX_PROBLEMS],
        problem_count=len(ledger.problems),
        cancelled=sum(len(w.cancelled) for w in workers),
        not_found=dict(not_found),
    )


async def serve(
    counts: dict[str, int],
    *,
    host: str,
    port: int,
    bootstrap_port: int,
    token_delay: float,
    latency: float,
) -> Summary:
    """Run the workers until SIGTERM or SIGINT; print the ready line first. Ports are consecutive
    from `port`, or free ones when it is 0; prefill k announces bootstrap port `bootstrap_port + k`.
    """
    ledger = Ledger()
    workers: list[FakeWorker] = []
    for role in ("prefill", "decode", "null"):
        for k in range(counts[role]):
            worker = FakeWorker(
                role,
                ledger,
                bootstrap_port=bootstrap_port + k if role == "prefill" else None,
                host=host,
                port=port + len(workers) if port else 0,
                record=False,
            )
            worker.token_delay, worker.latency = token_delay, latency
            await worker.start()
            workers.append(worker)
    ready = {
        "prefill": [[w.url, w.bootstrap_port] for w in workers if w.role == "prefill"],
        "decode": [w.url for w in workers if w.role == "decode"],
        "null": [w.url for w in workers if w.role == "null"],
        "pid": os.getpid(),
    }
    print(json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for worker in workers:
        await worker.stop()
    return summarize(workers, ledger)


class FakeWorkerProcess:
    """`prefills` + `decodes` + `nulls` fake workers in one background process; a context manager.

    `cpu` pins the process to one CPU. The process's stderr goes to `log_path` (a temporary file
    by default), shown in the error if it fails to start.
    """

    def __init__(
        self,
        prefills: int = 1,
        decodes: int = 1,
        nulls: int = 0,
        *,
        host: str = "127.0.0.1",
        bootstrap_port: int = ports.BOOTSTRAP,
        token_delay: float = 0.0,
        latency: float = 0.0,
        cpu: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "tests.support.fake_worker",
            "--prefills",
            str(prefills),
            "--decodes",
            str(decodes),
            "--nulls",
            str(nulls),
            "--host",
            host,
            "--bootstrap-port",
            str(bootstrap_port),
            "--token-delay",
            str(token_delay),
            "--latency",
            str(latency),
        ]
        if cpu is not None:
            self.argv += ["--cpu", str(cpu)]
        self.log_path = log_path or Path(tempfile.mkdtemp(prefix="pdkit-fake-")) / "fake.log"
        self.proc: subprocess.Popen[str] | None = None
        self.prefills: list[tuple[str, int]] = []
        self.decodes: list[str] = []
        self.nulls: list[str] = []
        self.summary: Summary | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the fake workers are not started")
        return self.proc.pid

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the process and wait until every worker listens; RuntimeError (with the log)
        if it exits or is not ready within `timeout_s`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self._kill()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the fake workers did not start ({self.log_path}):\n{tail}")
        info: dict[str, Any] = json.loads(line)
        self.prefills = [(url, int(port)) for url, port in info["prefill"]]
        self.decodes, self.nulls = info["decode"], info["null"]
        return self

    def stop(self, timeout_s: float = 10.0) -> Summary:
        """SIGTERM, wait for the summary line (SIGKILL after `timeout_s`); returns the summary."""
        proc = self.proc
        if proc is None or proc.stdout is None:
            return self.summary or Summary()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(deadline - time.monotonic(), 0.1))
        self._kill()
        self.summary = Summary(**json.loads(line)) if line.strip() else Summary()
        return self.summary

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
