"""The Plan's router process: pdkit's (`python -m kit.lb`) or smg, the Rust SGLang Model
Gateway, both rendered here from the one table of router options
(`kit.topology.router_options`). Pure.

Both take the same worker flags; the Plan stores them (`worker_args`) apart from the router's
own settings (`settings`), and composes `command.flags` from the two: `pdkit up` changes
the workers through the router's API, and restarts the router only when its settings change.

pdkit's router gets each option the topology sets (`plan=` in the table) where it differs
from the router's default, then `router.args`. smg gets the flags it spells as pdkit does
(listen address, policies), its own Prometheus listener, then its equivalent of each option
that has one (`smg=`), then `router.args`. `router_problems` checks the values pdkit's router
would be given, as it checks them at start-up.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kit.errors import Problem
from kit.net import bare_host
from kit.topology.args import Flag, flag_groups, flatten, normalize_flag
from kit.topology.layout import ROUTER_PROCESS, HostLayout, unit_name
from kit.topology.plan_types import Command, RouterProcess, WorkerProcess
from kit.topology.restarts import router_hold_s
from kit.topology.router_flags import SAME, RouterOption, router_policy, worker_chat_parsers
from kit.topology.router_options import (
    BY_FLAG,
    DEFAULTS,
    KEY_FILES,
    ROUTER_OPTIONS,
    WORKER_FLAGS,
    model_tokenizer_path,
    option_problems,
)
from kit.topology.schema import ArgValue, Topology

LB_MODULE = "kit.lb"
SMG_EXECUTABLE = "smg"
SMG_REQUIREMENT = "smg==1.13.0"
"""What provisioning installs into the router host's venv for `router.kind: smg` (the version
pdkit renders smg's flags for)."""
SMG_LAUNCH = ("launch", "--pd-disaggregation")
"""smg's subcommand and mode: they come first, the workers right after."""
FIX_VALUE = "fix the value (every option: `pdkit lb --help`)."
ROUTER_API_KEY_ENV = "PDKIT_ROUTER_API_KEY"
"""The variable that holds the router's client API key on the router host (env file 0600)."""


def worker_flags(workers: Iterable[WorkerProcess]) -> list[Flag]:
    """The worker flags of the processes that serve HTTP (node rank 0 of each instance), in
    Plan order, in the form both routers take (`--prefill URL BOOTSTRAP_PORT`, `--decode URL`)."""
    flags: list[Flag] = []
    for w in workers:
        if not w.serves_http:
            continue
        if w.role == "prefill":
            flags.append(("--prefill", w.url, str(w.bootstrap_port)))
        else:
            flags.append(("--decode", w.url))
    return flags


def extra_flags(topology: Topology) -> list[Flag]:
    """The topology's `router.args`, rendered like every `args:`."""
    return flag_groups({normalize_flag(k): v for k, v in topology.router.args.items()})


def pdkit_settings(topology: Topology) -> list[Flag]:
    """pdkit's router options: each one the topology sets, then `router.args`."""
    flags = []
    for option in ROUTER_OPTIONS:
        value = option.planned(topology)
        if value is not None:
            flags.append(option.render(value))
    return flags + extra_flags(topology)


def smg_settings(topology: Topology) -> list[Flag]:
    """smg's own options after `launch --pd-disaggregation`: the flags it spells as pdkit's
    router does (listen address, policies), its Prometheus listener, its equivalents of our
    retries and circuit breaker (`router.faults`), then `router.args`."""
    router = topology.router
    same = [o.render(o.plan(topology)) for o in ROUTER_OPTIONS if o.smg is SAME and o.plan]
    metrics = [
        ("--prometheus-host", bare_host(router.bind)),
        ("--prometheus-port", str(router.metrics_port)),
    ]
    translated = [
        flag
        for o in ROUTER_OPTIONS
        if o.smg is not None and o.smg.render is not None
        for flag in o.smg.render(topology)
    ]
    return [*same, *metrics, *translated, *extra_flags(topology)]


def build_router(
    topology: Topology, workers: list[WorkerProcess], layout: HostLayout, topology_dir: Path
) -> RouterProcess:
    """The router of a validated topology, listing `workers`; `topology_dir` is the topology
    file's folder (a relative `router.api_key_file` is taken from there)."""
    router = topology.router
    host = topology.host(topology.router_host)
    policies = {role: router_policy(topology, role) for role in ("prefill", "decode")}
    workers_ = tuple(worker_flags(workers))
    has_key = bool(router.api_key_env or router.api_key_file)
    if router.kind == "pdkit":
        settings = tuple(pdkit_settings(topology))
        command = Command(module=LB_MODULE, flags=(*workers_, *settings))
        metrics_port = None
    else:
        launch = tuple((word,) for word in SMG_LAUNCH)
        rest = tuple(smg_settings(topology))
        settings = (*launch, *rest)
        command = Command(
            executable=SMG_EXECUTABLE,
            flags=(*launch, *workers_, *rest),
            secret_args=(("--api-key", ROUTER_API_KEY_ENV),) if has_key else (),
        )
        metrics_port = router.metrics_port
    key_file = None
    if router.api_key_file:
        # Relative to the topology's folder, so that every stage reads the same file.
        key_file = str(topology_dir / Path(router.api_key_file).expanduser())
    return RouterProcess(
        name=ROUTER_PROCESS,
        kind=router.kind,
        host=host.name,
        address=bare_host(host.address),
        bind=bare_host(router.bind),
        port=router.port,
        metrics_port=metrics_port,
        prefill_policy=policies["prefill"],
        decode_policy=policies["decode"],
        api_key_env=router.api_key_env,
        api_key_file=key_file,
        unit=unit_name(topology.name, ROUTER_PROCESS),
        log_path=layout.log_file(ROUTER_PROCESS),
        command=command,
        worker_args=flatten(workers_),
        settings=settings,
        env={},
        hold_timeout_s=router_hold_s(router),
        tls=router.tls is not None,
        tokenizer_path=router_tokenizer_path(settings) if router.kind == "pdkit" else None,
    )


def router_tokenizer_path(settings: Sequence[Flag]) -> str | None:
    """The folder of `--prompt-tokens model:PATH` among pdkit's router settings (the last one
    given wins, as argparse takes it), else None."""
    spec = None
    for flag in settings:
        if flag[0] == "--prompt-tokens" and len(flag) > 1:
            spec = flag[1]
    return model_tokenizer_path(spec) if spec else None


def router_problems(topology: Topology) -> list[Problem]:
    """Why pdkit's router would refuse the options a topology gives it: each `router.args`
    key it does not take or a value it would refuse, located at the key, and the checks it
    makes on all its values together (`option_problems`). Key files are not read (they live
    on the router host). Empty for smg (its flags are its own)."""
    if topology.router.kind != "pdkit":
        return []
    values: dict[str, Any] = {}  # name -> value, in the option's unit
    for option in ROUTER_OPTIONS:
        value = option.planned(topology)
        if value is not None:
            values[option.name] = value
    problems: list[Problem] = []
    # In the order they are rendered: a later flag wins, as on the router's command line.
    given = {normalize_flag(k): v for k, v in topology.router.args.items()}
    for key, raw in sorted(topology.router.args.items(), key=lambda kv: normalize_flag(kv[0])):
        name = normalize_flag(key)
        switch = BY_FLAG.get(f"--{name}")
        # false renders no flag: a switch on by default would stay on without a word
        if (
            raw is False
            and switch is not None
            and switch.negatable
            and given.get(f"no-{name}") is not True
        ):
            problems.append(
                Problem(
                    ("router", "args", key),
                    f"{key}: false leaves {switch.flag} on (it is on by default).",
                    f"set no-{name}: true to turn it off.",
                )
            )
            continue
        taken = _arg_value(normalize_flag(key), raw)
        if isinstance(taken, Problem):
            problems.append(Problem(("router", "args", key), taken.message, taken.fix))
        elif taken is not None:
            values[taken[0].name] = taken[1]
    if problems:
        return problems
    parsers = worker_chat_parsers(topology)
    if values.get("chat_bridge") is True and parsers:
        problems.append(
            Problem(
                ("router", "args"),
                f"router.args turns the chat bridge on, but the workers run {' and '.join(parsers)}"
                ": a chat bridged through /v1/completions comes back without its reasoning or "
                "tool calls parsed",
                "remove chat-bridge from router.args (pdkit gives the router --no-chat-bridge "
                "when the workers parse chat output), or drop the parser flags from the workers' "
                "args.",
            )
        )
        return problems
    where: tuple[str, ...] = ("router", "args") if topology.router.args else ("router",)
    out = []
    for problem in option_problems(replace(DEFAULTS, **values)):
        message, _, fix = problem.partition(" To fix: ")
        out.append(
            Problem(
                where,
                f"pdkit's router would refuse its options: {message.rstrip('.')}.",
                fix or "fix router.args or router.faults (every option: `pdkit lb --help`).",
            )
        )
    return out


def _arg_value(key: str, raw: ArgValue) -> tuple[RouterOption, object] | Problem | None:
    """The option a `router.args` key sets and its value, as the rendered flag sets it;
    None when it renders nothing (false or null); a Problem when the router would refuse it."""
    rendered = flag_groups({key: raw})
    flag = f"--{key}"
    if not rendered or flag in KEY_FILES:
        return None  # nothing rendered, or a key file (read on the router host)
    if flag in WORKER_FLAGS:
        return Problem((), f"{flag} is not set here.", "the workers come from the topology.")
    if f"{flag}-file" in KEY_FILES:
        return Problem(
            (),
            f"{flag} is not taken on the command line (it would show in ps).",
            f"use {key}-file (router.api_key_env or router.api_key_file for the client key).",
        )
    negated = BY_FLAG.get(f"--{key.removeprefix('no-')}") if key.startswith("no-") else None
    option = BY_FLAG.get(flag) or (negated if negated and negated.negatable else None)
    if option is None:
        close = difflib.get_close_matches(flag, [*BY_FLAG, *KEY_FILES], n=1)
        fix = f"did you mean {close[0][2:]}?" if close else "every option: `pdkit lb --help`."
        return Problem((), f"pdkit's router has no option {flag}.", fix)
    values = rendered[0][1:]
    if option.kind is bool:
        if values:
            return Problem((), f"{flag} is a switch.", f"set {key}: true, or leave it out.")
        return option, option is not negated
    if len(values) != 1:
        return Problem((), f"pdkit's router would refuse it: {flag} takes one value.", "give one.")
    try:
        value = option.parse(values[0])
    except ValueError as exc:
        return Problem((), f"pdkit's router would refuse it: {exc}.", FIX_VALUE)
    problem = option.problem(value)
    if problem is not None:
        return Problem((), f"pdkit's router would refuse it: {problem}.", FIX_VALUE)
    return option, value
