"""The options more than one command takes, each declared once (as `Annotated` aliases), and
the one way a command's option values become the args object its library takes.

An option only one command has stays beside that command.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    ArgsT = TypeVar("ArgsT", bound=DataclassInstance)
else:
    ArgsT = TypeVar("ArgsT")

TopologyArg = Annotated[
    Path, typer.Argument(help="Topology YAML file.", metavar="TOPOLOGY", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Keep state in DIR/<name>/ (default: .pdkit/<name>/ beside the topology, "
        "or $PDKIT_STATE_DIR/<name>/).",
        metavar="DIR",
        show_default=False,
    ),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show Ansible's output.")]
ExtraVarsOpt = Annotated[
    list[str] | None,
    typer.Option("-e", "--extra-var", help="Set a role variable.", metavar="NAME=VALUE"),
]

# A live change (`pdkit up`, `pdkit restart`).
ParallelOpt = Annotated[
    int,
    typer.Option(
        "--parallel",
        min=1,
        help="Instances replaced at a time in a live change (one of each role keeps serving).",
    ),
]
DrainTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--drain-timeout",
        min=0,
        help="Seconds an instance leaving the router may take to finish its requests "
        "(default: 60).",
        metavar="SECONDS",
        show_default=False,
    ),
]


def pair_timeout(flag: str) -> Any:  # typer.Option is typed Any
    """The KV transfer check's per-pair timeout: `--gate-timeout` of up, `--timeout` of doctor."""
    return typer.Option(
        flag,
        min=0.1,
        help="Seconds each prefill x decode pair may take (default: 15).",
        metavar="SECONDS",
        show_default=False,
    )


def reference_url(flag: str) -> Any:  # typer.Option is typed Any
    """The token check's reference: `--gate-reference` of up, `--reference` of doctor."""
    return typer.Option(
        flag,
        help="URL of a colocated server of the same model (--disaggregation-mode null): every "
        "pair's tokens must equal its answer (default: the pairs must agree).",
        metavar="URL",
        show_default=False,
    )


# The probes of `pdkit health` and `pdkit status`.
ProbeTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.05,
        help="Seconds each probe request may take (SGLang's /health itself takes about 1 s).",
    ),
]
ConcurrencyOpt = Annotated[
    int, typer.Option("--concurrency", min=1, help="Probe requests in flight at most.")
]

# The workload and SLO options `pdkit bench` and `pdkit size` share.
InputLenOpt = Annotated[str, typer.Option("--input-len", help="Prompt tokens.")]
OutputLenOpt = Annotated[str, typer.Option("--output-len", help="Output tokens.")]
ArrivalsOpt = Annotated[str, typer.Option("--arrivals", help="Arrival process.")]
TtftOpt = Annotated[
    float | None, typer.Option("--ttft-ms", help="TTFT objective (default: topology slo).")
]
TpotOpt = Annotated[
    float | None, typer.Option("--tpot-ms", help="TPOT objective (default: topology slo).")
]
AttainmentOpt = Annotated[
    float | None, typer.Option("--attainment", help="Share that must meet both (0..1).")
]


def args_from(
    cls: type[ArgsT], given: Mapping[str, object], *, cli_only: Collection[str] = ()
) -> ArgsT:
    """`cls`, a dataclass of a command's options, from the command's parameter values by name.

    Each field of `cls` is a parameter of the command and each parameter a field, save those
    named in `cli_only` (handled by the command itself); a drift is a bug, so it raises.
    """
    names = {f.name for f in fields(cls)}
    missing = sorted(names - set(given))
    unknown = sorted(set(given) - names - set(cli_only))
    if missing or unknown:
        raise TypeError(
            f"{cls.__name__} and the command's parameters differ: "
            f"no parameter for {missing}, no field for {unknown}"
        )
    return cls(**{name: given[name] for name in names})
