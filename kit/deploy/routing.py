"""The router's worker list at run time: join a worker, take one out (draining it), look.

pdkit's load balancer (kit/lb/admin.py), with the deployment's admin key:
    GET    /workers                          {"workers": [{"url", "role", "state", "inflight"}]}
    POST   /workers {"url", "role", "bootstrap_port"}    pending until its first good probe
    DELETE /workers?url=URL&wait=true&grace=S[&back_within=B]
                                             no new requests; answers once its in-flight
                                             requests finished or after S s (pdkit's drain
                                             timeout; those left are cut off); with B, a
                                             replacement: listed as "returning" (its role's
                                             requests held) until POSTed again, or B s
smg 1.13:
    GET    /workers                          {"workers": [{"id", "url", "worker_type",
                                                           "is_healthy", "status"}]}
    POST   /workers {"url", "worker_type", "bootstrap_port"}   202, added in the background
    DELETE /workers/{id}                     no new requests; listed as "draining" until its
                                             requests finished, then no longer listed

The admin key is made once per deployment on the control machine (`admin_key`) and reaches the
router's environment file like the client key: through a variable of the ansible-playbook
process, never the inventory.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kit.errors import DeployError
from kit.net import classify_failure

ADMIN_KEY_FILE = "router-admin.key"
REQUEST_TIMEOUT_S = 10.0
POLL_S = 0.25


def admin_key(state_dir: Path) -> str:
    """The deployment's router admin key: read from the state dir, made (0600) on first use."""
    path = state_dir / ADMIN_KEY_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


@dataclass(frozen=True)
class Routed:
    """A worker as the router sees it: `state` healthy, pending, unhealthy or draining."""

    url: str
    role: str
    state: str
    inflight: int | None = None
    ident: str | None = None
    """smg's worker id (its DELETE takes it)."""

    @property
    def routed(self) -> bool:
        return self.state == "healthy"


def parse_workers(kind: str, body: Any) -> dict[str, Routed]:
    """The router's `/workers` answer by worker URL (no trailing slash). Pure."""
    items = body.get("workers") if isinstance(body, dict) else None
    found: dict[str, Routed] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        url = item["url"].rstrip("/")
        if kind == "smg":
            healthy = item.get("is_healthy") is True
            state = "healthy" if healthy else str(item.get("status") or "pending")
            role = str(item.get("worker_type") or "?")
            found[url] = Routed(url, role, state, None, str(item.get("id") or "") or None)
        else:
            inflight = item.get("inflight")
            found[url] = Routed(
                url,
                str(item.get("role") or "?"),
                str(item.get("state") or "?"),
                inflight if isinstance(inflight, int) else None,
            )
    return found


@dataclass(frozen=True)
class Drained:
    """How taking a worker out went: `clean` when no request was left on it."""

    url: str
    clean: bool
    seconds: float
    left: int | None = None


class RouterAdmin:
    """One router's worker API, over one aiohttp session (an async context manager)."""

    def __init__(self, kind: str, url: str, key: str | None, drain_timeout: float) -> None:
        self.kind = kind
        self.url = url.rstrip("/")
        self.drain_timeout = drain_timeout
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RouterAdmin:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> tuple[int, Any]:
        assert self._session is not None, "use RouterAdmin as an async context manager"
        sent = False
        try:
            async with self._session.request(
                method,
                self.url + path,
                json=body,
                params=params,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                sent = True
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
                return resp.status, data
        except (aiohttp.ClientError, TimeoutError) as exc:
            _, why = classify_failure(exc, sent, timeout)
            raise DeployError(
                f"the {self.kind} router at {self.url} did not answer {method} {path}: {why}"
            ) from exc

    def _refused(self, method: str, path: str, status: int, data: Any) -> DeployError:
        detail = data.get("error") if isinstance(data, dict) else data
        if isinstance(detail, dict):
            detail = detail.get("message")
        hint = ""
        if status in (401, 403):
            hint = (
                " To fix: run `pdkit up` once more so that the router gets the deployment's admin "
                "key (it restarts the router once)."
            )
        return DeployError(
            f"the {self.kind} router at {self.url} refused {method} {path}: HTTP {status}"
            f"{f': {detail}' if detail else ''}.{hint}"
        )

    async def workers(self) -> dict[str, Routed]:
        status, data = await self._call("GET", "/workers")
        if status != 200:
            raise self._refused("GET", "/workers", status, data)
        return parse_workers(self.kind, data)

    async def add(self, url: str, role: str, bootstrap_port: int | None) -> None:
        """Register a worker (no-op when the router lists it already, unless as returning: then
        its new process is added)."""
        url = url.rstrip("/")
        listed = (await self.workers()).get(url)
        if listed is not None and listed.state != "returning":
            return
        role_field = "worker_type" if self.kind == "smg" else "role"
        body: dict[str, Any] = {"url": url, role_field: role}
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        status, data = await self._call("POST", "/workers", body=body)
        if status not in (200, 201, 202):
            raise self._refused("POST", "/workers", status, data)

    async def wait_routed(self, url: str, timeout: float) -> Routed:
        """Until the router routes to `url` (its health probes passed); DeployError at timeout."""
        url = url.rstrip("/")
        deadline = time.monotonic() + timeout
        seen: Routed | None = None
        while True:
            seen = (await self.workers()).get(url)
            if seen is not None and seen.routed:
                return seen
            if time.monotonic() > deadline:
                state = f"it is {seen.state}" if seen else "it does not list it"
                raise DeployError(
                    f"the {self.kind} router does not route to {url} after {timeout:.0f} s "
                    f"({state}), although the worker answers /health."
                )
            await asyncio.sleep(POLL_S)

    async def remove(self, url: str, back_within: float = 0.0) -> Drained:
        """Take `url` out of routing and wait until its requests finished (at most the drain
        timeout); removing a worker the router does not list is a clean no-op. With
        `back_within` > 0 (pdkit's router; smg has no such state) the worker is being replaced:
        the router lists it as returning and holds its role's requests until `add` brings it
        back, or for that many seconds."""
        url = url.rstrip("/")
        began = time.monotonic()
        listed = (await self.workers()).get(url)
        if listed is None:
            return Drained(url, True, 0.0)
        if self.kind == "smg":
            return await self._remove_smg(listed, began)
        params = {"url": url, "wait": "true", "grace": f"{self.drain_timeout:g}"}
        if back_within > 0:
            params["back_within"] = f"{back_within:g}"
        status, data = await self._call(
            "DELETE",
            "/workers",
            params=params,
            timeout=self.drain_timeout + 30,
        )
        if status not in (200, 202, 404):
            raise self._refused("DELETE", "/workers", status, data)
        clean = bool(data.get("drained", True)) if isinstance(data, dict) else True
        left = data.get("inflight_left") if isinstance(data, dict) else None
        return Drained(
            url, clean, time.monotonic() - began, left if isinstance(left, int) else None
        )

    async def started(self) -> float | None:
        """When the router's process image started (pdkit's router: /health's `started`, unix
        seconds; a handover changes it); None where the router does not say."""
        status, data = await self._call("GET", "/health")
        value = data.get("started") if status == 200 and isinstance(data, dict) else None
        return float(value) if isinstance(value, int | float) else None

    async def wait_started_after(self, before: float, timeout: float) -> float:
        """Until the router answers /health from an image started after `before` (a handover
        done: the new image serves on the socket); DeployError at timeout. The old image does
        not accept connections while it finishes its requests, so a poll may wait or fail."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                started = await self.started()
            except DeployError:
                started = None
            if started is not None and started > before:
                return started
            if time.monotonic() > deadline:
                raise DeployError(
                    f"the {self.kind} router at {self.url} did not come back from its handover "
                    f"within {timeout:.0f} s. To fix: see `pdkit logs TOPOLOGY router`."
                )
            await asyncio.sleep(POLL_S)

    async def _remove_smg(self, listed: Routed, began: float) -> Drained:
        if listed.ident is None:
            raise DeployError(f"smg lists {listed.url} without a worker id; cannot remove it")
        path = f"/workers/{listed.ident}"
        status, data = await self._call("DELETE", path)
        if status not in (200, 202, 204, 404):
            raise self._refused("DELETE", path, status, data)
        deadline = began + self.drain_timeout
        while time.monotonic() < deadline:
            if listed.url not in await self.workers():
                return Drained(listed.url, True, time.monotonic() - began)
            await asyncio.sleep(POLL_S)
        return Drained(listed.url, False, time.monotonic() - began)
