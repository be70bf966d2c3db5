"""Limits per client (--client-limits): a token bucket of requests and one of prompt tokens per
API key, so that one greedy client gets 429s while the others keep their share.

1. `client`: the request's `Authorization: Bearer KEY` is hashed (SHA-256) and looked up among
   the limited clients; a key not among them must be the router's own API key (when it has
   one) and is not limited.
2. `take_request`: one request from the client's request bucket, at arrival (before the body
   is read): an empty bucket is a 429 with Retry-After, the seconds until it holds one again.
3. `take_tokens`: the prompt's tokens (as the router counts them) from its token bucket, once
   the body is parsed. A prompt larger than the bucket passes when the bucket is full and
   leaves it in debt, so that a long prompt is slowed, never refused for ever.

Refusals and admissions are counted per client name in /metrics (`LimitsCollector`). Where
several processes serve the port, their buckets live in shared memory (`SharedBuckets`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import multiprocessing
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kit.lb.errors import ApiError
from kit.topology.client_limits import ClientLimit, parse_limits

Clock = Callable[[], float]


class TokenBucket:
    """`rate` units per second, holding at most `capacity`; may go into debt (see `take`)."""

    __slots__ = ("_clock", "_last", "capacity", "level", "rate")

    def __init__(self, rate: float, capacity: float, clock: Clock) -> None:
        self.rate = rate
        self.capacity = capacity
        self.level = capacity
        self._clock = clock
        self._last = clock()

    def refill(self) -> float:
        """The level now, after what the rate added since the last look."""
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._last) * self.rate)
        self._last = now
        return self.level

    def take(self, amount: float) -> float:
        """Take `amount` and return 0, or take nothing and return the seconds until it could.
        An amount above the capacity passes on a full bucket (the level goes below zero)."""
        level = self.refill()
        need = min(amount, self.capacity)
        if level >= need:
            self.level = level - amount
            return 0.0
        return (need - level) / self.rate


class SharedBuckets:
    """Bucket states in memory shared across fork (`kit.lb.processes`), one lock for all:
    the processes of one router take from the same buckets, so a client gets its rate
    whichever process its connections reach. Made before the fork; zeroed slots are full."""

    STATE = struct.Struct("<dd")  # level, last refill (time.monotonic, the same in every process)

    def __init__(self, count: int) -> None:
        self._mm = mmap.mmap(-1, max(count, 1) * self.STATE.size)
        self.lock = multiprocessing.get_context("fork").Lock()

    def load(self, index: int) -> tuple[float, float]:
        level, last = self.STATE.unpack_from(self._mm, index * self.STATE.size)
        return level, last

    def save(self, index: int, level: float, last: float) -> None:
        self.STATE.pack_into(self._mm, index * self.STATE.size, level, last)


class SharedTokenBucket(TokenBucket):
    """A `TokenBucket` whose state is slot `index` of `SharedBuckets`."""

    __slots__ = ("_index", "_store")

    def __init__(
        self, rate: float, capacity: float, clock: Clock, store: SharedBuckets, index: int
    ) -> None:
        super().__init__(rate, capacity, clock)
        self._store, self._index = store, index

    def refill(self) -> float:
        with self._store.lock:
            return self._shared_refill()

    def _shared_refill(self) -> float:
        level, last = self._store.load(self._index)
        if last == 0.0:  # never used: full
            level, last = self.capacity, self._clock()
        self.level, self._last = level, last
        level = super().refill()
        self._store.save(self._index, level, self._last)
        return level

    def take(self, amount: float) -> float:
        with self._store.lock:
            level = self._shared_refill()
            need = min(amount, self.capacity)
            if level < need:
                return (need - level) / self.rate
            self.level = level - amount
            self._store.save(self._index, self.level, self._last)
            return 0.0


@dataclass(slots=True)
class Client:
    """One limited client: its buckets (None: no limit of that kind) and its counts."""

    name: str
    digest: bytes
    requests: TokenBucket | None
    tokens: TokenBucket | None
    admitted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # "requests" | "tokens" -> count
    prompt_tokens: float = 0.0


def _bucket(
    rate: float | None, burst_s: float, clock: Clock, shared: SharedBuckets | None, index: int
) -> TokenBucket | None:
    if rate is None:
        return None
    capacity = max(rate * burst_s, 1.0)
    if shared is None:
        return TokenBucket(rate, capacity, clock)
    return SharedTokenBucket(rate, capacity, clock, shared, index)


class ClientLimits:
    """The limited clients of one router process; `api_key` is the router's own key (its
    holders are not limited), None for an open router."""

    def __init__(
        self,
        clients: list[ClientLimit],
        api_key: str | None,
        *,
        share: float = 1.0,
        shared: SharedBuckets | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        # Several processes on one port: `shared` buckets (2 slots per client, in order), or
        # else `share`, this process's part of each rate.
        self._api_key = api_key
        self._by_digest: dict[bytes, Client] = {}
        if shared is not None:
            share = 1.0
        for i, c in enumerate(clients):
            rps = c.requests_per_s * share if c.requests_per_s else None
            tps = c.prompt_tokens_per_s * share if c.prompt_tokens_per_s else None
            client = Client(
                name=c.name,
                digest=bytes.fromhex(c.key_sha256),
                requests=_bucket(rps, c.burst_s, clock, shared, 2 * i),
                tokens=_bucket(tps, c.burst_s, clock, shared, 2 * i + 1),
            )
            self._by_digest[client.digest] = client

    @classmethod
    def from_text(
        cls,
        text: str,
        api_key: str | None,
        share: float = 1.0,
        shared: SharedBuckets | None = None,
    ) -> ClientLimits | None:
        """From `--client-limits` (already checked at start-up); None when it names none."""
        clients = parse_limits(text)
        return cls(clients, api_key, share=share, shared=shared) if clients else None

    @staticmethod
    def slots(text: str) -> int:
        """Shared bucket slots the clients of a `--client-limits` text need."""
        return 2 * len(parse_limits(text))

    @property
    def clients(self) -> list[Client]:
        return list(self._by_digest.values())

    def client(self, authorization: str) -> Client | None:
        """The limited client an `Authorization` header names, None for the router's own key
        (or any key, on an open router); ApiError 401 for a key neither knows."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            found = self._by_digest.get(hashlib.sha256(token.encode()).digest())
            if found is not None:
                return found
        key = self._api_key
        if key is None:
            return None
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise ApiError(
                401, "missing or wrong API key: send 'Authorization: Bearer KEY'", "unauthorized"
            )
        return None

    def take_request(self, client: Client) -> None:
        """One request from `client`'s request bucket; ApiError 429 when it is empty."""
        if client.requests is not None:
            wait = client.requests.take(1.0)
            if wait > 0:
                raise self._refuse(client, "requests", wait)

    def take_tokens(self, client: Client, tokens: float) -> None:
        """`tokens` prompt tokens from `client`'s token bucket; ApiError 429 when it is short."""
        if client.tokens is not None:
            wait = client.tokens.take(tokens)
            if wait > 0:
                raise self._refuse(client, "tokens", wait)
        client.admitted += 1
        client.prompt_tokens += tokens

    @staticmethod
    def _refuse(client: Client, kind: str, wait: float) -> ApiError:
        client.refused[kind] = client.refused.get(kind, 0) + 1
        bucket = client.requests if kind == "requests" else client.tokens
        rate = bucket.rate if bucket is not None else 0.0
        what = "requests" if kind == "requests" else "prompt tokens"
        return ApiError(
            429,
            f"client {client.name!r} is over its limit of {rate:g} {what} per second; "
            f"retry after {wait:.2f} s",
            "client_limit",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )


class LimitsCollector(Collector):
    """/metrics families of the limited clients, labelled by client name (never the key)."""

    def __init__(self, limits: ClientLimits) -> None:
        self._limits = limits

    def collect(self) -> Iterator[Metric]:
        admitted = CounterMetricFamily(
            "pdkit_lb_client_admitted",
            "Requests a limited client sent within its limits",
            labels=["client"],
        )
        refused = CounterMetricFamily(
            "pdkit_lb_client_limited",
            "Requests refused with 429: the client was over its limit (limit: requests or tokens)",
            labels=["client", "limit"],
        )
        tokens = CounterMetricFamily(
            "pdkit_lb_client_prompt_tokens",
            "Prompt tokens of the requests a limited client sent within its limits",
            labels=["client"],
        )
        level = GaugeMetricFamily(
            "pdkit_lb_client_bucket_level",
            "What a client's bucket holds now (requests or prompt tokens)",
            labels=["client", "limit"],
        )
        for c in self._limits.clients:
            admitted.add_metric([c.name], c.admitted)
            tokens.add_metric([c.name], c.prompt_tokens)
            for kind, bucket in (("requests", c.requests), ("tokens", c.tokens)):
                refused.add_metric([c.name, kind], c.refused.get(kind, 0))
                if bucket is not None:
                    level.add_metric([c.name, kind], bucket.refill())
        yield from (admitted, refused, tokens, level)
