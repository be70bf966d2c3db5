"""A KV pool cluster on this machine for tests and `make bench-kvpool`: the real Mooncake Store
master (`python -m mooncake.cli`, the wheel's mooncake_master, its HTTP metadata server
embedded), sim prefills with HiCache whose L3 is that store, one sim decode, and pdkit's router;
every port free, every process stopped on exit.

`protocol` is the pool's MOONCAKE_PROTOCOL: the sim moves pages over TCP either way and
charges the load by that link. `pool=False` gives the same cluster with HiCache but no storage
backend (each prefill caches only its own prefixes): the baseline the pool is measured
against.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tests.support.sim_launch import (
    _LIVE,
    SimProcess,
    _terminate,
    free_port,
    start_router,
    worker_argv,
)

SEGMENT_BYTES = 32 << 30
"""DRAM each prefill gives the pool, emulated bytes (the sim stores them scaled down)."""


class PoolMaster:
    """mooncake_master on loopback with free ports; a context manager."""

    def __init__(
        self, log_dir: Path, segment_bytes: int = SEGMENT_BYTES, protocol: str = "tcp"
    ) -> None:
        self.segment_bytes = segment_bytes
        self.protocol = protocol
        self.rpc_port, self.metrics_port, self.metadata_port = (free_port() for _ in range(3))
        self.log_path = log_dir / f"mooncake-master-{self.rpc_port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def env(self) -> dict[str, str]:
        """The MOONCAKE_* environment pdkit renders for a pool client (kit/sglang/hicache.py)."""
        return {
            "MOONCAKE_MASTER": f"127.0.0.1:{self.rpc_port}",
            "MOONCAKE_TE_META_DATA_SERVER": f"http://127.0.0.1:{self.metadata_port}/metadata",
            "MOONCAKE_PROTOCOL": self.protocol,
            "MOONCAKE_DEVICE": "",
            "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(self.segment_bytes),
        }

    def start(self, timeout_s: float = 30.0) -> PoolMaster:
        argv = [
            sys.executable,
            "-m",
            "mooncake.cli",
            f"--rpc_port={self.rpc_port}",
            "--rpc_address=127.0.0.1",
            f"--metrics_port={self.metrics_port}",
            "--metrics_host=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.metadata_port}",
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        _LIVE.add(self.proc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"mooncake_master not ready:\n{self.log_path.read_text()[-2000:]}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _terminate(self.proc, grace_s=5.0)


class PoolCluster:
    """`prefills` sim prefills (HiCache; L3 on the pool when `pool`), one decode, the router."""

    def __init__(
        self,
        *,
        prefills: int = 2,
        pool: bool = True,
        segment_bytes: int = SEGMENT_BYTES,
        protocol: str = "tcp",
        model: str = "meta-llama/Llama-3.1-8B-Instruct",
        env: dict[str, str] | None = None,
        extra: Sequence[str] = (),
        lb_args: Sequence[str] = ("--health-interval", "0.05"),
        timeout_s: float = 30.0,
    ) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="pdkit-kvpool-"))
        self.master = PoolMaster(self.log_dir, segment_bytes, protocol) if pool else None
        hicache = ["--enable-hierarchical-cache", "--enable-cache-report"]
        if pool:
            hicache += ["--hicache-storage-backend", "mooncake"]
        base_env = {**(env or {}), **(self.master.env if self.master else {})}
        self.bootstrap_ports = [free_port() for _ in range(prefills)]
        self.prefills = [
            SimProcess(
                worker_argv(
                    port=free_port(),
                    mode="prefill",
                    bootstrap_port=port,
                    model=model,
                    extra=[*hicache, *extra, "--base-gpu-id", str(i)],
                ),
                env=base_env,
                log_dir=self.log_dir,
            )
            for i, port in enumerate(self.bootstrap_ports)
        ]
        self.decode = SimProcess(
            worker_argv(
                port=free_port(),
                mode="decode",
                model=model,
                extra=["--enable-cache-report", *extra, "--base-gpu-id", str(prefills)],
            ),
            env=env,
            log_dir=self.log_dir,
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lb_args = list(lb_args)
        self.timeout_s = timeout_s
        self.lb: subprocess.Popen[bytes] | None = None

    def start(self) -> PoolCluster:
        if self.master is not None:
            self.master.start(self.timeout_s)
        for worker in [*self.prefills, self.decode]:
            worker.start()
        for worker in [*self.prefills, self.decode]:
            worker.wait_ready(self.timeout_s)
        argv: list[str] = []
        for prefill, port in zip(self.prefills, self.bootstrap_ports, strict=True):
            argv += ["--prefill", prefill.url, str(port)]
        argv += ["--decode", self.decode.url, "--host", "127.0.0.1", "--port", str(self.port)]
        log_path = self.log_dir / f"lb-{self.port}.log"
        self.lb = start_router([*argv, *self.lb_args], log_path, self.url, self.timeout_s)
        if self.lb.poll() is not None:
            self.stop()
            raise RuntimeError(f"the router did not get ready:\n{log_path.read_text()[-3000:]}")
        return self

    def stop(self) -> None:
        if self.lb is not None and self.lb.poll() is None:
            _terminate(self.lb, grace_s=5.0)
        for worker in [*self.prefills, self.decode]:
            worker.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> PoolCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
