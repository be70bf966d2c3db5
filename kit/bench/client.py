"""Send one request and time it: the first token, every gap between tokens, the end.

One `Client` holds one aiohttp session (pooled keep-alive connections, no limit: the
workload, not the pool, decides the concurrency). Streams are read line by line; a chunk that
carries text counts as a token arrival (SGLang and the sim send one token per chunk; where a
server batches several, `usage.completion_tokens` gives the count and TPOT divides by it).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from kit.bench.records import RequestRecord
from kit.net import classify_failure

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
EMPTY = "the server answered 200 with no generated token"
"""Such a request failed: it is never counted as an answer, let alone as goodput."""


@dataclass(frozen=True)
class Target:
    """Where requests go: an OpenAI-compatible base URL (no /v1), the model name, an API key,
    and whether it is pdkit's router (which can say where a lost request went)."""

    url: str
    model: str
    api_key: str | None = None
    pdkit_router: bool = False
    via: str = ""
    """What `url` is, where a topology has router replicas: their VIP, or the one replica."""


class Client:
    """Use as `async with Client(target, timeout) as client:`; `timeout` is seconds per
    request, from sending to the last byte."""

    def __init__(self, target: Target, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self.router_knows_paths: bool | None = True if target.pdkit_router else None
        """Whether the server can say where a lost request went (pdkit's router): True once an
        answer carried the PD path, False once it refused the look-up, None until then (a
        `--url` run whose first requests all hang still asks, and learns)."""
        headers = {"Content-Type": "application/json"}
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        self._headers = headers

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Client used outside `async with`")
        return self._session

    async def send(self, record: RequestRecord, path: str, body: bytes, stream: bool) -> None:
        """Send `body` to `path` and fill `record` with what happened; never raises for a
        failed request (it is recorded)."""
        url = self.target.url + path
        headers = {"X-Request-Id": record.request_id}
        sent = False
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                async with self.session.post(url, data=body, headers=headers) as response:
                    sent = True
                    record.status = response.status
                    self._path(record, response)
                    if response.status != 200:
                        text = (await response.read()).decode("utf-8", "replace")
                        _fail(record, "http", _error_text(text) or f"HTTP {response.status}")
                    elif stream:
                        await self._read_stream(record, response, started)
                    else:
                        await self._read_whole(record, response, started)
        except TimeoutError:
            _fail(record, "timeout", f"no complete answer within {self.timeout:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            kind, detail = classify_failure(exc, sent, self.timeout)
            _fail(record, kind, detail)
        record.e2e_ms = (time.perf_counter() - started) * 1000
        # Only a request that got no answer at all needs asking (an answer names its path).
        if not record.ok and record.status == 0 and self.router_knows_paths is not False:
            await self._ask_router(record)

    def _path(self, record: RequestRecord, response: aiohttp.ClientResponse) -> None:
        headers = response.headers
        record.prefill = headers.get("X-PDKit-Prefill", "")
        if record.prefill:
            self.router_knows_paths = True
        record.decode = headers.get("X-PDKit-Decode", "")
        room = headers.get("X-PDKit-Bootstrap-Room")
        record.bootstrap_room = int(room) if room and room.isdigit() else None

    async def _read_stream(
        self, record: RequestRecord, response: aiohttp.ClientResponse, started: float
    ) -> None:
        first: float | None = None
        last = 0.0
        tokens = 0
        usage: dict[str, Any] | None = None
        ext: dict[str, Any] | None = None
        pending = b""
        # Read whatever has arrived (one or more SSE events); events that came in one read
        # arrived together, so they share its time.
        async for data in response.content.iter_any():
            now = time.perf_counter()
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n")  # noqa: PLW2901
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                payload = event.strip()
                if not payload.startswith(b"data:"):
                    continue
                payload = payload[5:].strip()
                if payload == b"[DONE]":
                    break
                # Most events carry one token: find its text without parsing the JSON; parse
                # only the events that may carry usage or an error.
                if b'"usage":{' in payload or b'"error"' in payload:
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        _fail(record, "stream", _error_text(json.dumps(chunk)) or "error event")
                        return
                    usage = chunk.get("usage") or usage
                    ext = chunk.get("sglext") or ext
                    if not _has_text(chunk):
                        continue
                elif not _has_text_bytes(payload):
                    continue
                if first is None:
                    first = now
                    record.ttft_ms = (now - started) * 1000
                else:
                    record.itl_ms.append((now - last) * 1000)
                last = now
                tokens += 1
        if first is None:
            _fail(record, "empty", f"{EMPTY} (the stream ended without one)")
            return
        count = int(usage["completion_tokens"]) if usage else tokens
        if count <= 0:
            _fail(record, "empty", EMPTY)
            return
        record.completion_tokens = count
        record.prompt_tokens = int(usage["prompt_tokens"]) if usage else None
        _cached(record, usage, ext)
        record.tpot_ms = (last - first) * 1000 / (count - 1) if count > 1 else 0.0
        record.ok = True

    async def _read_whole(
        self, record: RequestRecord, response: aiohttp.ClientResponse, started: float
    ) -> None:
        data = json.loads(await response.read())
        usage = data.get("usage") or {}
        record.ttft_ms = (time.perf_counter() - started) * 1000  # no stream: first = last
        record.completion_tokens = int(usage.get("completion_tokens") or 0)
        record.prompt_tokens = usage.get("prompt_tokens")
        # A 200 with nothing generated is no answer: usage says 0 tokens, or (no usage) no text.
        if record.completion_tokens <= 0 and ("completion_tokens" in usage or not _has_text(data)):
            _fail(record, "empty", EMPTY)
            return
        _cached(record, usage, data.get("sglext"))
        record.tpot_ms = 0.0
        record.ok = True

    async def _ask_router(self, record: RequestRecord) -> None:
        """Where a failed request went, from pdkit's router (best effort)."""
        try:
            async with (
                asyncio.timeout(5),
                self.session.get(
                    f"{self.target.url}/requests", params={"id": record.request_id}
                ) as response,
            ):
                if response.status != 200:
                    # Another router (or server) has no such look-up: stop asking it. A 404 from
                    # pdkit's router (a request it never saw) carries its JSON error body.
                    if response.status != 404 or response.content_type != "application/json":
                        self.router_knows_paths = self.router_knows_paths or False
                    return
                path = await response.json()
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return
        record.prefill = str(path.get("prefill") or "")
        record.decode = str(path.get("decode") or "")
        room = path.get("bootstrap_room")
        record.bootstrap_room = room if isinstance(room, int) else None


_TEXT = re.compile(rb'"(?:content|text)"\s*:\s*"[^"]')
"""A delta's content or a completion's text that is not empty, in a chunk's JSON bytes."""


def _has_text_bytes(data: bytes) -> bool:
    """Whether a chunk carries text, judged from its bytes without parsing the JSON."""
    return _TEXT.search(data) is not None


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        if delta is not None and delta.get("content"):
            return True
        if choice.get("text"):
            return True
    return False


def _error_text(body: str) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    if isinstance(data, dict) and "message" in data:
        return str(data["message"])[:300]
    return body.strip()[:300]


def _fail(record: RequestRecord, kind: str, detail: str) -> None:
    record.ok = False
    record.error_kind = kind
    record.error = detail


def _cached(
    record: RequestRecord, usage: dict[str, Any] | None, ext: dict[str, Any] | None
) -> None:
    """The cached prompt tokens an answer reports, and their sources when it breaks them down
    (SGLang's `sglext.cached_tokens_details`: device, host, storage)."""
    details = (usage or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        record.cached_tokens = int(details["cached_tokens"])
    sources = (ext or {}).get("cached_tokens_details")
    if isinstance(sources, dict):
        record.cached_device = int(sources.get("device") or 0) + int(sources.get("host") or 0)
        record.cached_storage = int(sources.get("storage") or 0)
        if record.cached_tokens is None:
            record.cached_tokens = record.cached_device + record.cached_storage
