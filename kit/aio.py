"""Running pdkit's asyncio programs: uvloop's event loop where it is installed (it is a
dependency everywhere but Windows), the standard one otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default) when uvloop is missing."""
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the fastest loop available."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
