"""Limits per client (`router.limits`): token buckets per API key, and the one text form the
router takes them in (`--client-limits`).

A client is named in the topology with the SHA-256 of its key, never the key: the hash is no
secret, so the Plan may put it on the router's command line, and the router compares hashes.
Each client has a bucket of requests per second and one of prompt tokens per second; each
holds `burst_s` seconds of its rate, so a client that was idle may send that much at once.

The text form: `NAME=SHA256:REQUESTS_PER_S:PROMPT_TOKENS_PER_S:BURST_S`, clients separated by
commas, a rate of 0 for no limit of that kind (`format_limits` / `parse_limits`).
"""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from kit.topology.strict import Strict

CLIENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
SHA256_HEX = r"^[0-9a-f]{64}$"
_NAME = re.compile(CLIENT_NAME)
_HASH = re.compile(SHA256_HEX)


class ClientLimit(Strict):
    """One client's limits: a client over either gets 429 with Retry-After (pdkit's router);
    other clients keep their share. Counted per name in /metrics."""

    name: str = Field(
        pattern=CLIENT_NAME,
        description="The client's name in /metrics and the access log (never the key).",
    )
    key_sha256: str = Field(
        pattern=SHA256_HEX,
        description="SHA-256 (hex) of the API key the client sends as `Authorization: Bearer "
        "KEY`: `printf %s KEY | sha256sum`. The key itself never goes in the topology.",
    )
    requests_per_s: float | None = Field(
        None, gt=0, description="Requests per second; default: no request limit."
    )
    prompt_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="Prompt tokens per second (counted as the router counts them: exact with "
        "its tokenizer, else UTF-8 bytes / 4); default: no token limit.",
    )
    burst_s: float = Field(
        1.0,
        gt=0,
        description="Seconds of each rate a bucket holds: what an idle client may send at once.",
    )

    @model_validator(mode="after")
    def _one_rate(self) -> ClientLimit:
        if self.requests_per_s is None and self.prompt_tokens_per_s is None:
            raise ValueError(
                f"client {self.name!r} has no limit: set requests_per_s, prompt_tokens_per_s "
                "or both"
            )
        return self


def format_limits(limits: list[ClientLimit] | tuple[ClientLimit, ...]) -> str:
    """The `--client-limits` text of `limits` ('' for none)."""
    return ",".join(
        f"{c.name}={c.key_sha256}:{c.requests_per_s or 0:g}:{c.prompt_tokens_per_s or 0:g}:"
        f"{c.burst_s:g}"
        for c in limits
    )


def parse_limits(text: str) -> list[ClientLimit]:
    """The clients of a `--client-limits` text; ValueError saying what is wrong otherwise."""
    out: list[ClientLimit] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, rest = item.partition("=")
        fields = rest.split(":")
        if not eq or len(fields) != 4 or not _NAME.match(name) or not _HASH.match(fields[0]):
            raise ValueError(
                f"client limit {item[:40]!r}: expected NAME=SHA256:REQUESTS_PER_S:"
                "PROMPT_TOKENS_PER_S:BURST_S"
            )
        try:
            rps, tps, burst = (float(v) for v in fields[1:])
        except ValueError:
            raise ValueError(f"client limit {name!r}: the rates must be numbers") from None
        if rps < 0 or tps < 0 or burst <= 0 or rps == tps == 0:
            raise ValueError(
                f"client limit {name!r}: rates >= 0 (not both 0) and a burst > 0 seconds"
            )
        out.append(
            ClientLimit(
                name=name,
                key_sha256=fields[0],
                requests_per_s=rps or None,
                prompt_tokens_per_s=tps or None,
                burst_s=burst,
            )
        )
    return out


def limits_problem(limits: list[ClientLimit] | tuple[ClientLimit, ...]) -> str | None:
    """Why these clients cannot go together (a name or a key twice), else None."""
    for what, values in (
        ("name", [c.name for c in limits]),
        ("key_sha256", [c.key_sha256 for c in limits]),
    ):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            shown = twice[0] if what == "name" else twice[0][:12] + "..."
            return f"two clients share the {what} {shown}; each client needs its own"
    return None
