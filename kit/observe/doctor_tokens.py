"""The doctor's token check: every prefill x decode pair must answer the same greedy request
with the same tokens, and with a colocated reference server's where one is given. The
comparison itself is `kit.token_check`, shared with the router's token canary.
"""

from __future__ import annotations

from kit.observe.probe import Fetched
from kit.token_check import (
    CHECK_TOKENS,
    SHOWN_TOKENS,
    Answer,
    Expected,
    answer_from,
    disagreements,
    expected,
    first_difference,
    suspects,
)

__all__ = [
    "CHECK_TOKENS",
    "SHOWN_TOKENS",
    "Answer",
    "Expected",
    "answer_of",
    "disagreements",
    "expected",
    "first_difference",
    "suspects",
]


def answer_of(fetched: Fetched | None) -> Answer | None:
    """The answer in a `/generate` reply (one request; None when it has none)."""
    return answer_from(fetched.json() if fetched is not None else None)
