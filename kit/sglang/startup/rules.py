"""What a start-up rule is: the values a role's servers start with, and one refusal of them.

    values.given("page-size")          # the command line carries --page-size
    values.number("chunked-prefill-size")
    rule.refuses(values)               # SGLang would refuse these values when it starts
    rule.message(values)               # SGLang's message, with the values filled in

The tables of rules, one per SGLang version, live next to this module (`v0_5_23.py`); the
predicate builders below are what they are made of.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kit.sglang.catalog import Catalog
from kit.topology.schema import ROLE_NAMES


class LaunchValues:
    """The values one role's SGLang servers start with, by flag name without dashes
    ("page-size"): what the user set in args, what pdkit sets from the topology, else SGLang's
    default. A flag set to false or null is left out of the command, so it has its default."""

    def __init__(self, mode: str, values: Mapping[str, object], catalog: Catalog) -> None:
        self.mode = mode
        """--disaggregation-mode: "prefill" or "decode"."""
        self._values = values
        self._catalog = catalog

    def given(self, flag: str) -> bool:
        """Whether the command line carries `flag` (set, not false or null)."""
        value = self._values.get(flag)
        return value is not None and value is not False  # `in (None, False)` would take 0

    def value(self, flag: str) -> object:
        if self.given(flag):
            return self._values[flag]
        spec = self._catalog.lookup(flag)
        return spec.default if spec else None

    def on(self, flag: str) -> bool:
        return self.value(flag) is True

    def number(self, flag: str) -> float | None:
        """The value as a number; None when unset or not a number (the catalog check reports a
        value of the wrong type)."""
        value = self.value(flag)
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int | float):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            return None

    def size(self, flag: str) -> float:
        """A parallel size: the number, 1 when unset."""
        number = self.number(flag)
        return 1 if number is None else number

    def text(self, flag: str) -> str | None:
        value = self.value(flag)
        return None if value is None else str(value)

    def shown(self, flag: str) -> str:
        """The value as SGLang prints it in a message: 2, not 2.0."""
        number = self.number(flag)
        if number is not None and number.is_integer():
            return str(int(number))
        return str(self.value(flag))


Refuses = Callable[[LaunchValues], bool]


@dataclass(frozen=True)
class StartupRule:
    """One value SGLang refuses at start.

    `flag` is the flag the problem points at: the rule applies only where the user set it (or,
    for a flag pdkit sets, where the topology key behind it does). `says` is SGLang's message,
    whose `{flag}` fields are filled with the role's values as SGLang fills them. `hook` is
    the SGLang function that raises it ("<module>.<function>" under `sglang.srt.arg_groups`;
    empty where no hook does) and `source` the file:line under `sglang/srt` that raises it.
    `needs_gpu`: SGLang refuses it only on a GPU host, so no test here can run SGLang's check.
    """

    name: str
    flag: str
    refuses: Refuses
    says: str
    fix: str
    hook: str
    source: str
    modes: tuple[str, ...] = ROLE_NAMES
    needs_gpu: bool = False

    def message(self, values: LaunchValues) -> str:
        return self.says.format_map(_Shown(values))


class _Shown(dict[str, str]):
    """`str.format_map` fields -> the role's values, as SGLang shows them."""

    def __init__(self, values: LaunchValues) -> None:
        super().__init__()
        self._values = values

    def __missing__(self, flag: str) -> str:
        return self._values.shown(flag)


def below(flag: str, bound: float) -> Refuses:
    def refuses(v: LaunchValues) -> bool:
        number = v.number(flag)
        return number is not None and number < bound

    return refuses


def at_most(flag: str, bound: float) -> Refuses:
    def refuses(v: LaunchValues) -> bool:
        number = v.number(flag)
        return number is not None and number <= bound

    return refuses


def outside(flag: str, low: float, high: float, *, open_low: bool, open_high: bool) -> Refuses:
    """The value is not in the interval: [low, high], or (low, ... / ..., high) where open."""

    def refuses(v: LaunchValues) -> bool:
        n = v.number(flag)
        if n is None:
            return False
        return (n <= low if open_low else n < low) or (n >= high if open_high else n > high)

    return refuses


def given_all(*flags: str) -> Refuses:
    return lambda v: all(v.given(flag) for flag in flags)


def without(flag: str, needed: str) -> Refuses:
    return lambda v: v.given(flag) and not v.given(needed)


def json_not_object(flag: str) -> Refuses:
    """A JSON string that parses to something other than an object."""

    def refuses(v: LaunchValues) -> bool:
        if not v.given(flag):
            return False
        try:
            return not isinstance(json.loads(str(v.value(flag))), dict)
        except ValueError:
            return False  # not JSON at all: the catalog check reports it

    return refuses


def nonnegative(flag: str, says: str, hook: str, source: str) -> StartupRule:
    fix = f"set {flag} to 0 or more."
    return StartupRule(f"{flag}-negative", flag, below(flag, 0), says, fix, hook, source)


def positive(flag: str, says: str, hook: str, source: str) -> StartupRule:
    fix = f"set {flag} to 1 or more."
    return StartupRule(f"{flag}-not-positive", flag, at_most(flag, 0), says, fix, hook, source)


__all__ = [
    "LaunchValues",
    "Refuses",
    "StartupRule",
    "at_most",
    "below",
    "given_all",
    "json_not_object",
    "nonnegative",
    "outside",
    "positive",
    "without",
]
