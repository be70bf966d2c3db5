"""Start sim workers as subprocesses (tests, benchmarks, demos) and always stop them.

``SimProcess`` runs ``sys.executable -m kit.sim ARGV`` with its own session and log file,
waits until ``/health`` answers 200 (or the process dies, with its log in the error), and
kills it on exit, at interpreter exit at the latest.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.support.ports import free_port

_LIVE: set[subprocess.Popen[bytes]] = set()


def _kill_all() -> None:
    for proc in list(_LIVE):
        _terminate(proc, grace_s=0.5)


atexit.register(_kill_all)


def _terminate(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    _LIVE.discard(proc)


class SimProcess:
    """One ``python -m kit.sim`` worker; a context manager."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: str | Path | None = None,
        group: Sequence[str] = (),
    ) -> None:
        self.argv = list(argv)
        self.group = list(group)
        """`python -m kit.ranks` flags: run the worker under its rank group's agent."""
        self.env = {**os.environ, **(env or {})}
        self.host = host
        self.port = port if port is not None else int(self._flag("--port", "30000"))
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdkit-sim-"))
        self.log_path = self.log_dir / f"sim-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _flag(self, name: str, default: str) -> str:
        if name in self.argv:
            return self.argv[self.argv.index(name) + 1]
        return default

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimProcess:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*self._agent(), sys.executable, "-m", "kit.sim", *self.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        _LIVE.add(self.proc)
        return self

    def _agent(self) -> list[str]:
        return [sys.executable, "-m", "kit.ranks", *self.group, "--"] if self.group else []

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout_s: float = 30.0, path: str = "/health") -> SimProcess:
        """Poll `path` until 200; raise RuntimeError (with the log) if the worker dies or
        the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"sim worker exited ({code}):\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"sim worker not ready after {timeout_s}s:\n{self.log()[-3000:]}")

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.proc is None:
            return None
        _terminate(self.proc, grace_s)
        return self.proc.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def __enter__(self) -> SimProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def worker_argv(
    *,
    port: int,
    mode: str = "null",
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    served_name: str = "llama",
    bootstrap_port: int | None = None,
    page_size: int = 16,
    host: str = "127.0.0.1",
    extra: Sequence[str] = (),
) -> list[str]:
    """launch_server-style argv, as pdkit renders it for one worker."""
    argv = [
        "--model-path",
        model,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--page-size",
        str(page_size),
        "--enable-metrics",
    ]
    if mode != "null":
        argv += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake_tcp"]
        if bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return [*argv, *extra]


def healthy(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the server at `url` answers GET /health with 200 (no answer, an error: False)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except OSError:  # urllib's HTTPError and URLError are OSErrors
        return False


def request_json(
    url: str,
    body: object | None = None,
    timeout_s: float = 30.0,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, object]:
    """GET (no body) or POST JSON; returns (status, decoded JSON or text) for any status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def start_router(
    argv: Sequence[str], log_path: Path, url: str, timeout_s: float
) -> subprocess.Popen[bytes]:
    """``python -m kit.lb ARGV`` logging to `log_path`, once `url`/readiness answers 200; a
    router that exits or is not ready in time is killed (its `poll()` is then not None)."""
    repo = Path(__file__).resolve().parents[2]
    with log_path.open("wb") as log:  # a file: a pipe nobody reads would fill and block
        proc = subprocess.Popen(
            [sys.executable, "-m", "kit.lb", *argv],
            cwd=repo,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _LIVE.add(proc)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + "/readiness", timeout=2) as answer,
        ):
            if answer.status == 200:
                return proc
        if time.monotonic() > deadline:
            _terminate(proc, grace_s=5.0)
            break
        time.sleep(0.05)
    return proc


class PdCluster:
    """One prefill and one decode sim worker behind ``python -m kit.lb``, every process stopped
    on exit; a context manager. `extra` is added to both workers' argv, `lb_args` to the
    router's. `url` is the router's, `prefill` and `decode` the workers."""

    def __init__(
        self,
        *,
        model: str = "meta-llama/Llama-3.1-8B-Instruct",
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
        lb_args: Sequence[str] = ("--health-interval", "0.05"),
        timeout_s: float = 30.0,
    ) -> None:
        bootstrap = free_port()
        self.bootstrap_port = bootstrap
        self.prefill = SimProcess(
            worker_argv(
                port=free_port(), mode="prefill", bootstrap_port=bootstrap, model=model, extra=extra
            ),
            env=env,
        )
        self.decode = SimProcess(
            worker_argv(
                port=free_port(), mode="decode", model=model, extra=[*extra, "--base-gpu-id", "1"]
            ),
            env=env,
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lb_args = list(lb_args)
        self.timeout_s = timeout_s
        self.lb: subprocess.Popen[bytes] | None = None
        self.lb_log = self.prefill.log_dir / f"lb-{self.port}.log"

    def start(self) -> PdCluster:
        """Start everything and wait until the router is ready (RuntimeError with the logs)."""
        self.prefill.start()
        self.decode.start()
        self.prefill.wait_ready(self.timeout_s)
        self.decode.wait_ready(self.timeout_s)
        argv = ["--prefill", self.prefill.url, str(self.bootstrap_port), "--decode"]
        argv += [self.decode.url, "--host", "127.0.0.1", "--port", str(self.port)]
        self.lb = start_router([*argv, *self.lb_args], self.lb_log, self.url, self.timeout_s)
        if self.lb.poll() is not None:
            self.stop()
            output = self.lb_log.read_text(errors="replace")
            raise RuntimeError(f"the router did not get ready:\n{output[-3000:]}")
        return self

    def stop(self) -> None:
        if self.lb is not None and self.lb.poll() is None:
            _terminate(self.lb, grace_s=5.0)
        self.decode.kill(signal.SIGCONT)  # a test may have stopped it
        self.prefill.stop()
        self.decode.stop()

    def __enter__(self) -> PdCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
