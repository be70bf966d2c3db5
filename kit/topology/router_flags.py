"""One entry of the router options table (`kit.topology.router_options`): its type
(`RouterOption`, made by `option`), how its value becomes a flag and back, smg's equivalent
(`Smg`), and the functions an entry names for the value a topology gives pdkit's router
(`plan=`) and for smg's flags (`Smg(render=)`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from kit.topology.args import Flag, normalize_flag
from kit.topology.policies import DEFAULT_POLICIES
from kit.topology.schema import SLO, Topology
from kit.topology.timeouts import handoff_limit_s

T = TypeVar("T")
Bound = Literal["> 0", ">= 0"]
PlanValue = Callable[[Topology], object]
"""The value (in the option's own unit) the Plan gives the router from a topology, or None:
the topology leaves the router's default."""

STALL_TPOTS = 50
MIN_STALL = 2.0
EJECT_BACKOFF_MAX = 30.0
"""The router's longest ejection by default (s); a longer first one raises it."""
SMG_REQUEST_TIMEOUT = 1800
"""smg 1.13's --request-timeout-secs default (s)."""
_SLO = SLO()


SIM_WORKERS = "sim"
"""--prompt-tokens sim: the emulated model's tokenizer, its vocabulary from the workers."""


def model_tokenizer(topology: Topology) -> str | None:
    """--prompt-tokens for the served model's tokenizer: ``model:PATH`` where the model is a
    folder every host sees (an absolute path, so the router's host too) served by real SGLang;
    ``sim`` for emulated workers (their tokenizer, the vocabulary asked of them, so that a chat
    stream cut by a dead decode goes on); None otherwise (a Hugging Face repo id on real
    SGLang): the router then counts and routes as it did without one."""
    if topology.engine == "sim":
        return SIM_WORKERS
    path = topology.model.path
    return f"model:{path}" if topology.engine == "sglang" and path.startswith("/") else None


CHAT_PARSER_FLAGS = ("reasoning-parser", "tool-call-parser")
"""SGLang flags whose parsing only /v1/chat/completions does (reasoning_content, tool_calls):
a chat stream bridged through /v1/completions would come back without it."""


def worker_chat_parsers(topology: Topology) -> tuple[str, ...]:
    """The chat parser flags (`CHAT_PARSER_FLAGS`) any worker is given."""
    roles = (topology.defaults.args, topology.prefill.args, topology.decode.args)
    found = {normalize_flag(key) for args in roles for key in args}
    return tuple(f"--{flag}" for flag in CHAT_PARSER_FLAGS if flag in found)


def chat_bridge(topology: Topology) -> bool | None:
    """--no-chat-bridge when the workers parse chat output (`worker_chat_parsers`), else None."""
    return False if worker_chat_parsers(topology) else None


def worker_context_length(topology: Topology) -> int | None:
    """The prefills' ``--context-length`` (role args, then the shared ones), else None: the
    router then takes the model's own from its config.json."""
    for args in (topology.prefill.args, topology.defaults.args):
        for key, value in args.items():
            if normalize_flag(key) == "context-length" and isinstance(value, int):
                return value
    return None


def stall_timeout_for(tpot: float) -> float:
    """The default stall timeout (s) for a TPOT objective of `tpot` s: 50 token times, at
    least 2 s (a decode step that long is a stopped worker, not a busy one)."""
    return max(STALL_TPOTS * tpot, MIN_STALL)


@dataclass(frozen=True, slots=True)
class Smg:
    """smg 1.13's equivalent of an option: the flags that carry it, and how they are rendered
    from a topology (`render` None: smg spells the flag as pdkit does, with the Plan's value)."""

    flags: tuple[str, ...]
    render: Callable[[Topology], list[Flag]] | None = None


@dataclass(frozen=True, slots=True)
class RouterOption:
    """One entry of the table, as `ROUTER_OPTIONS` lists it (see `option` for the fields)."""

    help: str
    group: str
    unit: str = ""
    scale: float = 1
    flag: str = ""
    aliases: tuple[str, ...] = ()
    rendered: str = ""
    bound: Bound | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    plan: PlanValue | None = None
    always: bool = False
    smg: Smg | None = None
    name: str = ""
    kind: type = object
    """int, float, str or bool: what the flag's text is converted to."""
    optional: bool = False
    default: object = None

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every flag that sets the option, the documented one first."""
        return (self.flag, *self.aliases)

    @property
    def negatable(self) -> bool:
        """A switch that is on unless turned off (`--no-migrate`)."""
        return self.kind is bool and self.default is True

    def text(self, value: object) -> str:
        """`value` (in the option's unit) as its flag takes it."""
        if isinstance(value, bool) or value is None:
            return str(value)
        if isinstance(value, int | float) and (self.kind is float or self.scale != 1):
            return f"{value / self.scale:g}"
        return str(value)

    def render(self, value: object) -> Flag:
        """The flag that gives the router `value` (the spelling routers were started with)."""
        flag = self.rendered or self.flag
        if self.kind is bool:
            return (flag,) if value else (f"--no-{flag[2:]}",)
        return (flag, self.text(value))

    def parse(self, text: str) -> object:
        """The option's value from its flag's text (`ValueError` says why not); bounds are
        checked here, as argparse's type, so that a malformed value exits at once."""
        if self.kind is str:
            return text
        try:
            number = int(text) if self.kind is int and self.scale == 1 else float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if self.bound is not None and (number < 0 or (number == 0 and self.bound == "> 0")):
            raise ValueError(f"{text} must be {self.bound}")
        value = number * self.scale
        return int(value) if self.kind is int else value

    def problem(self, value: object) -> str | None:
        """Why `value` is not one this option takes, or None."""
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"{self.flag} {value}: expected one of {', '.join(self.choices)}"
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else 0
        if self.bound is not None and (number < 0 or (number == 0 and self.bound == "> 0")):
            return f"{self.flag} {self.text(value)}: must be {self.bound}"
        return None

    def planned(self, topology: Topology) -> object:
        """The value the Plan renders for this option, None when it renders none."""
        if self.plan is None:
            return None
        value = self.plan(topology)
        return value if value is not None and (self.always or value != self.default) else None


def option(
    default: T,
    help: str,
    *,
    group: str,
    unit: str = "",
    scale: float = 1,
    flag: str = "",
    aliases: tuple[str, ...] = (),
    rendered: str = "",
    bound: Bound | None = None,
    choices: tuple[str, ...] = (),
    metavar: str | None = None,
    plan: PlanValue | None = None,
    always: bool = False,
    smg: Smg | None = None,
) -> T:
    """One entry of the table. `help` may say `{default}` (the default as the flag takes
    it); `unit` is what the flag's number means (`ms`, `MiB`); `scale` turns it into the
    option's own unit (durations in seconds, sizes in bytes); `flag` defaults to the name's;
    `aliases` are older spellings still taken; `rendered` the spelling the Plan writes when it
    is not `flag`; `bound` the smallest value; `plan` the value a topology gives it (rendered
    where it differs from the default, or `always`); `smg` smg's equivalent."""
    entry = RouterOption(
        help=help,
        group=group,
        unit=unit,
        scale=scale,
        flag=flag,
        aliases=aliases,
        rendered=rendered,
        bound=bound,
        choices=choices,
        metavar=metavar,
        plan=plan,
        always=always,
        smg=smg,
    )
    return field(default=default, metadata={"option": entry})


# What a topology gives the router (`plan=`) and smg's flags for it (`Smg(render=)`).


def faults(key: str) -> PlanValue:
    return lambda t: getattr(t.router.faults, key)


def router_policy(topology: Topology, role: str) -> str:
    """The policy the router uses for `role`: the topology's, else its kind's default."""
    chosen: str | None = getattr(topology.router, f"{role}_policy")
    return chosen or DEFAULT_POLICIES[topology.router.kind][role]


def policy(role: str) -> PlanValue:
    return lambda t: router_policy(t, role)


def with_admission(value: Callable[[Topology], object]) -> PlanValue:
    return lambda t: value(t) if t.router.admission.enabled else None


def handoff_at_least(default: float) -> PlanValue:
    # The router waits for a prefill leg and a whole request at least as long as the workers
    # may hold it in the PD handoff, so that their error, naming the timeout, comes first.
    return lambda t: max(default, handoff_limit_s(t))


def stall(t: Topology) -> float | None:
    """The topology's stall timeout, None where the router derives the same from the TPOT
    objective it is given (--slo-tpot-ms, else its default)."""
    faults, admission = t.router.faults, t.router.admission
    stall = (faults.stall_timeout_ms or 0) / 1000 or stall_timeout_for(t.slo.tpot_ms / 1000)
    tpot = (admission.tpot_ms or t.slo.tpot_ms) if admission.enabled else _SLO.tpot_ms
    return None if stall == stall_timeout_for(tpot / 1000) else stall


def backoff_max(t: Topology) -> float | None:
    backoff = t.router.faults.eject_backoff_s
    return backoff if backoff > EJECT_BACKOFF_MAX else None


def smg_request_timeout(t: Topology) -> list[Flag]:
    handoff = handoff_limit_s(t)
    if handoff <= SMG_REQUEST_TIMEOUT:
        return []
    return [("--request-timeout-secs", str(math.ceil(handoff)))]


def smg_retries(t: Topology) -> list[Flag]:
    # smg's --retry-max-retries counts every attempt (its --disable-retries is 1).
    faults = t.router.faults
    if faults.retries == 0:
        return [("--disable-retries",)]
    return [
        ("--retry-max-retries", str(faults.retries + 1)),
        ("--retry-initial-backoff-ms", f"{faults.retry_backoff_ms:g}"),
    ]


def smg_breaker_threshold(t: Topology) -> list[Flag]:
    return [("--cb-failure-threshold", str(t.router.faults.eject_after_failures))]


def smg_breaker_open(t: Topology) -> list[Flag]:
    seconds = max(1, math.ceil(t.router.faults.eject_backoff_s))
    return [("--cb-timeout-duration-secs", str(seconds))]


SAME = Smg(())
"""smg takes the flag as pdkit's router does."""
