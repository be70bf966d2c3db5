"""TLS on the client port (--tls-cert/--tls-key, router.tls): the files are read on the router
host, and read again on SIGHUP: new connections get the new certificate while an open one
goes on with the old, nothing dropped; a bad file at a reload keeps the old certificate."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
import subprocess
from pathlib import Path

import pytest

from kit.lb.config import parse_args
from kit.lb.errors import LbConfigError, LbError
from kit.lb.run import serve
from kit.lb.tls import ServerTls
from tests.support.fake_worker import FakeWorker, Ledger
from tests.support.lb_cluster import run
from tests.support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key)),
            *("-out", str(cert), "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def client_context(*certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for cert in certs:
        context.load_verify_locations(cert)
    return context


def common_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("ssl_object").getpeercert()
    return dict(item for rdn in peer["subject"] for item in rdn)["commonName"]


async def get_health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(b"GET /health HTTP/1.1\r\nHost: lb\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return int(head[9:12])


def test_the_certificate_is_read_again_on_sighup_without_dropping_a_connection(tmp_path):
    old_cert, old_key = self_signed(tmp_path, "old")
    new_cert, new_key = self_signed(tmp_path, "new")
    cert, key = tmp_path / "lb.crt", tmp_path / "lb.key"
    shutil.copy(old_cert, cert)
    shutil.copy(old_key, key)
    trust = client_context(old_cert, new_cert)

    async def scenario() -> None:
        ledger = Ledger()
        workers = [FakeWorker("prefill", ledger, bootstrap_port=9000), FakeWorker("decode", ledger)]
        for w in workers:
            await w.start()
        config = parse_args(
            [
                *("--prefill", workers[0].url, "9000", "--decode", workers[1].url),
                *("--host", "127.0.0.1", "--port", str(free_port())),
                *("--tls-cert", str(cert), "--tls-key", str(key)),
            ],
            {},
        )
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        server = asyncio.create_task(serve(config, on_ready=ready.set_result, stop=stop))
        port = await ready
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
            assert common_name(writer) == "old" and await get_health(reader, writer) == 200
            shutil.copy(new_cert, cert)
            shutil.copy(new_key, key)
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.2)
            # The open connection goes on, with the certificate it started with ...
            assert await get_health(reader, writer) == 200 and common_name(writer) == "old"
            # ... and a new one gets the new certificate.
            reader2, writer2 = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
            assert common_name(writer2) == "new" and await get_health(reader2, writer2) == 200
            # A half-written key at the next reload: the new certificate stays.
            key.write_text("not a key")
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.2)
            _, writer3 = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
            assert common_name(writer3) == "new"
            for w in (writer, writer2, writer3):
                w.close()
        finally:
            stop.set()
            await server
            for w in workers:
                await w.stop()

    run(scenario())


def test_unreadable_files_stop_the_router_at_start_saying_which(tmp_path):
    with pytest.raises(LbError, match="cannot read the TLS certificate"):
        ServerTls(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key"))
    with pytest.raises(LbConfigError, match="--tls-cert and --tls-key go together"):
        parse_args(["--prefill", "http://a:1", "--decode", "http://b:2", "--tls-cert", "/x"], {})
