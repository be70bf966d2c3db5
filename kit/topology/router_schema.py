"""The router's admission, fault and canary settings (`router.admission`, `router.faults`,
`router.canary`): the schema, beside `kit.topology.schema`'s Router, which holds them."""

from __future__ import annotations

from pydantic import Field

from kit.topology.strict import Strict


class Admission(Strict):
    """SLO-aware admission (pdkit router, off by default): 429 at once when the SLO would be missed.

    A request predicted to miss the SLO (its time to first token from the prefill queues and
    their measured pace, its time per output token from the decode's batch) is answered at once
    with 429 and Retry-After instead of queueing, so that the requests admitted still meet it
    past the deployment's goodput rate. Clients may send `X-PDKit-Priority: high|normal|low`;
    the lowest is shed first. See docs/lb.md."""

    enabled: bool = Field(False, description="Turn admission on (router kind pdkit only).")
    margin: float = Field(
        0.2,
        ge=0,
        lt=0.5,
        description="Share of the SLO kept free for prediction error: normal requests may "
        "use 1 - margin of it, low 1 - 2 x margin, high all of it.",
    )
    ttft_ms: float | None = Field(
        None, gt=0, description="Time to first token target (ms); default: slo.ttft_ms."
    )
    tpot_ms: float | None = Field(
        None, gt=0, description="Time per output token target (ms); default: slo.tpot_ms."
    )


class Faults(Strict):
    """What the router does when a worker fails (see docs/lb.md, "Faults"). pdkit's router
    retries a request that failed before the client got a byte on a fresh pair, ejects a
    worker after failures in a row, holds requests while a role has no worker, and migrates
    a stream whose decode died or stalled; smg gets the retry and circuit-breaker settings
    (`--retry-*`, `--cb-*`) as far as its flags go."""

    retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Attempts after the first per request (retries and stream migrations).",
    )
    retry_deadline_s: float = Field(
        60.0, gt=0, description="No new attempt starts this long after a request arrived."
    )
    retry_backoff_ms: float = Field(
        50.0,
        ge=0,
        description="smg only: its first backoff between attempts (pdkit's router sends the "
        "retry at once, to a fresh pair).",
    )
    eject_after_failures: int = Field(
        3,
        ge=1,
        description="Failed requests in a row that take a worker out (smg: its circuit "
        "breaker's failure threshold).",
    )
    eject_backoff_s: float = Field(
        1.0,
        gt=0,
        description="How long a worker stays out at first, doubling per repeat (smg: how long "
        "its circuit stays open).",
    )
    hold_timeout_s: float = Field(
        5.0,
        ge=0,
        description="pdkit only: how long a request waits when a role has no healthy "
        "worker, before a 503 with Retry-After (0: no hold).",
    )
    first_token_timeout_s: float = Field(
        30.0,
        ge=0,
        description="pdkit only: longest wait for a stream's first token before it is sent "
        "again elsewhere.",
    )
    stall_timeout_ms: float | None = Field(
        None,
        gt=0,
        description="pdkit only: no token for this long and a stream is migrated; default "
        "50 x slo.tpot_ms, at least 2000.",
    )
    migrate: bool = Field(
        True,
        description="pdkit only: continue a stream whose decode died or stalled on another "
        "pair where the continuation is exact.",
    )


class Canary(Strict):
    """The token canary (pdkit router only; see docs/lb.md, "Token canary"). KV that arrives
    altered decodes into fluent, wrong tokens with status 200 (SGLang checks no KV by
    default), often hours after start, where the deploy gate cannot see it. Every
    `interval_s` the router sends one short greedy request to each prefill x decode pair, off
    the users' path, and compares the tokens across the pairs as the gate does; a worker all
    of whose pairs disagree with the majority is taken out until they agree again."""

    interval_s: float = Field(
        60.0,
        ge=0,
        description="Seconds between two rounds (one request of 8 tokens per pair each); "
        "0 turns the canary off.",
    )
