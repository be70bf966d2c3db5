"""The `pdkit` command line: thin. Each command builds the object it needs and calls the layer
below; `PdkitError` is caught once here and printed without a traceback (`--debug` shows it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from kit.errors import PdkitError

if TYPE_CHECKING:
    from kit.topology.plan import Plan

app = typer.Typer(
    name="pdkit",
    help=(
        "Deploy SGLang with prefill/decode disaggregation on bare-metal GPU hosts.\n\n"
        "Examples:\n\n"
        "  pdkit validate topologies/local.yaml\n\n"
        "  pdkit render topologies/llama-8b-1p1d.yaml\n\n"
        "  pdkit up topologies/local.yaml\n\n"
        "  pdkit status topologies/local.yaml --watch"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"debug": False}

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


def _pair_timeout(flag: str) -> Any:  # typer.Option is typed Any
    return typer.Option(
        flag,
        min=0.1,
        help="Seconds each prefill x decode pair may take (default: 15).",
        metavar="SECONDS",
        show_default=False,
    )


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    _state["debug"] = debug


def _resolve(topology: Path) -> Plan:
    """The topology's Plan, every check run (`kit.plan.resolve`)."""
    from kit.plan.resolve import resolve  # noqa: PLC0415 (the catalog load is not free)

    return resolve(topology)


@app.command(
    epilog="Examples:\n\n  pdkit validate topologies/local.yaml\n\n"
    "Exit status 0 when the topology can be deployed, 1 with every problem listed otherwise."
)
def validate(topology: TopologyArg) -> None:
    """Check a topology completely (shape, GPUs, ports, addresses, SGLang flags)."""
    plan = _resolve(topology)
    prefill, decode = plan.role("prefill"), plan.role("decode")
    out.print(
        f"{topology}: OK: {len(prefill)} prefill + {len(decode)} decode instance(s) on "
        f"{len({w.host for w in plan.workers})} host(s), {len(plan.workers)} worker process(es), "
        f"router {plan.router.kind} at {plan.router.url}"
    )


@app.command(
    epilog="Examples:\n\n  pdkit render topologies/llama-8b-1p1d.yaml\n\n"
    "  pdkit render topologies/local.yaml --json | jq '.workers[].command'"
)
def render(topology: TopologyArg, as_json: JsonOpt = False) -> None:
    """Show the exact launch command of every process, per host (or the Plan as JSON)."""
    from kit.plan.shell import plan_to_shell  # noqa: PLC0415

    plan = _resolve(topology)
    if as_json:
        print(plan.model_dump_json(indent=2))
    else:
        sys.stdout.write(plan_to_shell(plan))


@app.command(epilog="Example:\n\n  pdkit schema > topology.schema.json")
def schema() -> None:
    """Print the JSON Schema of the topology file (for editors and linters)."""
    from kit.topology.schema import Topology  # noqa: PLC0415

    print(json.dumps(Topology.model_json_schema(), indent=2, sort_keys=True))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
    epilog="Examples:\n\n"
    "  pdkit lb --prefill http://10.0.0.1:30000 8998 --decode http://10.0.0.2:30001 --port 8000\n\n"
    "  pdkit lb --topology topologies/local.yaml\n\n"
    "  pdkit lb --help   (every option)",
)
def lb(
    ctx: typer.Context,
    topology: Annotated[
        Path | None,
        typer.Option("--topology", help="Take workers, policies and port from this topology."),
    ] = None,
) -> None:
    """Run pdkit's PD load balancer in the foreground (options as `python -m kit.lb`)."""
    from kit.lb import main as lb_main  # noqa: PLC0415

    argv = list(ctx.args)
    if topology is not None:
        router = _resolve(topology).router
        if router.kind != "pdkit":
            raise PdkitError(
                f"{topology}: router.kind is {router.kind}; `pdkit lb` runs pdkit's router. "
                "To fix: set router.kind: pdkit, or run that router instead."
            )
        argv = [*router.command.args, *argv]
    raise typer.Exit(lb_main(argv))


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


@app.command(
    epilog="Examples:\n\n  pdkit health topologies/local.yaml && echo serving\n\n"
    "  pdkit health topologies/local.yaml --json | jq -r '.problems[].line'\n\n"
    "Exit status 0 when every worker and the router are healthy and are what the topology "
    "says, 1 otherwise, with one line per problem and its cause."
)
def health(
    topology: TopologyArg,
    as_json: JsonOpt = False,
    timeout: ProbeTimeoutOpt = 3.0,
    concurrency: ConcurrencyOpt = 128,
) -> None:
    """Probe every worker and the router once, concurrently; list what is wrong."""
    from kit.observe import ProbeOptions  # noqa: PLC0415
    from kit.observe import health as run_health  # noqa: PLC0415

    plan = _resolve(topology)
    raise typer.Exit(run_health(plan, out, ProbeOptions(timeout, concurrency), as_json))


@app.command(
    epilog="Examples:\n\n  pdkit status topologies/local.yaml\n\n"
    "  pdkit status topologies/local.yaml --watch --interval 5\n\n"
    "  pdkit status topologies/local.yaml --json | jq '.workers[] | {name, state}'\n\n"
    "With --watch --json, one JSON object per line per refresh."
)
def status(
    topology: TopologyArg,
    *,
    as_json: JsonOpt = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes (--watch).")
    ] = 2.0,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="Stop after this many refreshes.")
    ] = None,
    timeout: ProbeTimeoutOpt = 3.0,
    concurrency: ConcurrencyOpt = 128,
) -> None:
    """Show every worker per role and the router: state, load, PD queues, KV transfer, SLO."""
    from kit.observe import ProbeOptions  # noqa: PLC0415
    from kit.observe import status as run_status  # noqa: PLC0415

    plan = _resolve(topology)
    options = ProbeOptions(timeout, concurrency)
    raise typer.Exit(
        run_status(
            plan,
            out,
            options,
            as_json=as_json,
            watch=watch or count is not None,
            interval_s=interval,
            count=count,
        )
    )


@app.command(
    epilog="Examples:\n\n  pdkit up topologies/local.yaml\n\n"
    "  pdkit up topologies/llama-8b-1p1d.yaml --timeout 1200\n\n"
    "Runs Ansible (playbooks/deploy.yml) for the workers, waits until every worker answers "
    "/health, then deploys the router and waits for its /readiness; last, the gate sends one "
    "real PD request to every prefill x decode pair (`pdkit doctor`) and fails, naming the pair "
    "and the cause, when one moves no KV. Running it again changes nothing; after a topology "
    "change only the affected processes restart. State (inventory, Ansible output) goes to "
    ".pdkit/<name>/ beside the topology."
)
def up(
    topology: TopologyArg,
    *,
    state_dir: StateDirOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds for every worker to become ready (default: 120 for engine sim, "
            "1800 for sglang).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    router_timeout: Annotated[
        float | None,
        typer.Option(
            "--router-timeout",
            help="Seconds for the router to become ready.",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    verbose: VerboseOpt = False,
    no_gate: Annotated[
        bool,
        typer.Option(
            "--no-gate", help="Skip the last stage: one KV transfer per prefill x decode pair."
        ),
    ] = False,
    gate_timeout: Annotated[float | None, _pair_timeout("--gate-timeout")] = None,
    diff: Annotated[
        bool,
        typer.Option(
            "--diff", help="Print what would change in the running deployment; change nothing."
        ),
    ] = False,
    parallel: ParallelOpt = 1,
    drain_timeout: DrainTimeoutOpt = None,
) -> None:
    """Install and start every process of a topology, in order, and wait until it serves."""
    from kit.deploy import DeployContext, UpOptions  # noqa: PLC0415
    from kit.deploy import up as deploy_up  # noqa: PLC0415
    from kit.observe.doctor import DEFAULT_TIMEOUT_S, DoctorOptions  # noqa: PLC0415

    context = DeployContext.build(_resolve(topology), topology, state_dir)
    options = UpOptions(
        timeout,
        router_timeout,
        verbose,
        gate=not no_gate,
        gate_options=DoctorOptions(timeout_s=gate_timeout or DEFAULT_TIMEOUT_S),
        parallel=parallel,
        drain_timeout=drain_timeout,
        diff_only=diff,
    )
    deploy_up(context, out, options)


@app.command(
    epilog="Examples:\n\n  pdkit restart topologies/local.yaml decode\n\n"
    "  pdkit restart topologies/local.yaml prefill-1\n\n"
    "  pdkit restart topologies/local.yaml router\n\n"
    "Rolling: one instance at a time (--parallel N: N, keeping one of each role serving) is "
    "taken out of the router and drained, stopped, started, waited for (/health), checked by "
    "the KV transfer gate and put back. All node ranks of a multi-node instance restart "
    "together. `router` restarts the router, which drains its in-flight requests first. Refuses "
    "when the topology differs from what runs (`pdkit up` applies that)."
)
def restart(
    topology: TopologyArg,
    selector: Annotated[
        str | None,
        typer.Argument(
            help="prefill, decode, router or a process name (default: every worker).",
            show_default=False,
        ),
    ] = None,
    *,
    state_dir: StateDirOpt = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds for each restarted worker to become ready (default: 120 for engine "
            "sim, 1800 for sglang).",
            metavar="SECONDS",
            show_default=False,
        ),
    ] = None,
    parallel: ParallelOpt = 1,
    drain_timeout: DrainTimeoutOpt = None,
    no_gate: Annotated[
        bool,
        typer.Option("--no-gate", help="Skip the KV transfer check before each instance rejoins."),
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Restart processes one instance at a time, without dropping requests."""
    from kit.deploy import DeployContext, UpOptions  # noqa: PLC0415
    from kit.deploy import restart as deploy_restart  # noqa: PLC0415

    context = DeployContext.build(_resolve(topology), topology, state_dir)
    options = UpOptions(
        timeout, None, verbose, gate=not no_gate, parallel=parallel, drain_timeout=drain_timeout
    )
    deploy_restart(context, out, options, selector)


@app.command(
    epilog="Examples:\n\n  pdkit doctor topologies/local.yaml\n\n"
    "  pdkit doctor topologies/local.yaml --json | jq '.pairs[] | {prefill, decode, state}'\n\n"
    "Sends one real PD request (one output token, its own bootstrap room) straight to every "
    "prefill x decode pair, every DP rank included, and prints the matrix: TTFT and the KV "
    "transfer time and speed the prefill reports, or the failure with its cause from both "
    "workers' logs and the fix. Ends with the model's KV bytes per token and the transfer time "
    "of --input-len tokens at the measured speed, against the TTFT objective. Exit status 0 "
    "when every pair moved KV, 1 otherwise. `pdkit up` runs the same check last."
)
def doctor(
    topology: TopologyArg,
    as_json: JsonOpt = False,
    timeout: Annotated[float | None, _pair_timeout("--timeout")] = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            min=1,
            help="Pairs in flight per worker (1: each pair's transfer figures are its own).",
        ),
    ] = 1,
    input_len: Annotated[
        int, typer.Option("--input-len", min=1, help="Input tokens for the KV cost line.")
    ] = 2048,
) -> None:
    """Prove KV moves across every prefill x decode pair; name the cause when it does not."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.gate import run_doctor  # noqa: PLC0415
    from kit.observe.doctor import DEFAULT_TIMEOUT_S, DoctorOptions  # noqa: PLC0415

    context = DeployContext.build(_resolve(topology), topology)
    options = DoctorOptions(timeout_s=timeout or DEFAULT_TIMEOUT_S, parallel=parallel)
    raise typer.Exit(run_doctor(context, out, options, as_json=as_json, input_tokens=input_len))


@app.command(
    epilog="Examples:\n\n  pdkit down topologies/local.yaml\n\n"
    "Stops the router first, then the workers (playbooks/down.yml). Logs and configuration "
    "stay on the hosts; running it again is a quiet no-op."
)
def down(
    topology: TopologyArg,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Stop every process of a topology: router first, then workers."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy import down as deploy_down  # noqa: PLC0415

    deploy_down(DeployContext.build(_resolve(topology), topology, state_dir), out, verbose)


@app.command(
    epilog="Examples:\n\n  pdkit logs topologies/local.yaml\n\n"
    "  pdkit logs topologies/local.yaml decode-0 -n 200\n\n"
    "  pdkit logs topologies/local.yaml prefill -f\n\n"
    "PROCESS is a process name (prefill-0, decode-1-node1, router) or a role (prefill, "
    "decode); without it, every process. Logs live on each host under "
    "<root>/var/log/pdkit/<name>/."
)
def logs(
    topology: TopologyArg,
    process: Annotated[
        str | None,
        typer.Argument(help="Process name or role; default: all.", show_default=False),
    ] = None,
    lines: Annotated[
        int, typer.Option("--lines", "-n", help="Lines from the end of each log.")
    ] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
) -> None:
    """Show the logs of a deployment's processes."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.logs import show_logs  # noqa: PLC0415

    context = DeployContext.build(_resolve(topology), topology)
    selected = [context.log_file(name) for name in context.select_processes(process)]
    try:
        show_logs(selected, print, lambda text: err.print(text, markup=False), lines, follow)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command(
    epilog="Examples:\n\n  pdkit provision topologies/llama-8b-1p1d.yaml\n\n"
    "  pdkit provision T --wheelhouse wheelhouse/   (hosts without a package index)\n\n"
    "  pdkit provision T --check\n\n"
    "  pdkit provision T --skip nvidia --skip model -e pdkit_base_install_packages=false\n\n"
    "Runs playbooks/provision.yml over the same inventory as `pdkit up`. Roles: base (OS "
    "packages, locked-memory limit, huge pages), nvidia (driver check, persistence mode, fabric "
    "manager), rdma (devices, link state, GID table, GPUDirect RDMA), python (a venv under the "
    "root prefix with SGLang, Mooncake and this pdkit), model (weights). A second run changes "
    "nothing. --transfer-test then moves buffers with the Mooncake transfer engine between "
    "every pair of worker hosts on every rail and prints the bandwidth against the link rate."
)
def provision(
    topology: TopologyArg,
    *,
    check: Annotated[
        bool, typer.Option("--check", help="Report what would change; change nothing.")
    ] = False,
    wheelhouse: Annotated[
        Path | None,
        typer.Option(
            "--wheelhouse",
            help="Install Python packages only from this folder of wheels (or tar of them), "
            "pushed over SSH; the hosts need no package index.",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    index: Annotated[
        bool, typer.Option("--index", help="Hosts install from a package index (default).")
    ] = False,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", help="Leave out a role (repeatable).", metavar="ROLE"),
    ] = None,
    extra_vars: Annotated[
        list[str] | None,
        typer.Option("-e", "--extra-var", help="Set a role variable.", metavar="NAME=VALUE"),
    ] = None,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
    transfer_test: Annotated[
        bool,
        typer.Option(
            "--transfer-test",
            help="Then test Mooncake transfers between every pair of worker hosts, every rail.",
        ),
    ] = False,
) -> None:
    """Prepare the hosts: packages, limits, GPU and RDMA checks, Python env, model weights."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.provision import ProvisionOptions, parse_extra_vars  # noqa: PLC0415
    from kit.deploy.provision import provision as run_provision  # noqa: PLC0415

    if index and wheelhouse is not None:
        raise PdkitError("--index and --wheelhouse exclude each other: choose one source.")
    options = ProvisionOptions(
        check=check,
        wheelhouse=wheelhouse,
        skip=tuple(skip or ()),
        extra_vars=parse_extra_vars(extra_vars or []),
        verbose=verbose,
        transfer_test=transfer_test,
    )
    run_provision(DeployContext.build(_resolve(topology), topology, state_dir), out, options)


@app.command(
    epilog="Examples:\n\n  pdkit discover topologies/qwen3-2p1d-nicmap.yaml\n\n"
    "  pdkit discover lab.yaml --write lab-discovered.yaml\n\n"
    "Runs playbooks/discover.yml (read-only) over the same inventory as `pdkit provision` and "
    "reads each host's GPUs with their NUMA node and PCIe switch, and its RDMA devices with link "
    "layer, state, rate, NUMA node and GID table. Proposes gpus, gpu_type, rdma_devices and a "
    "gpu_nics map (each GPU's NIC: same PCIe switch, else same NUMA node), and a routable RoCE "
    "v2 transfer.gid_index common to the chosen NICs; --write FILE writes the topology with "
    "them, keeping its comments."
)
def discover(
    topology: TopologyArg,
    *,
    write: Annotated[
        Path | None,
        typer.Option(
            "--write",
            help="Write the topology with the proposed fields to FILE.",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    extra_vars: Annotated[
        list[str] | None,
        typer.Option("-e", "--extra-var", help="Set a role variable.", metavar="NAME=VALUE"),
    ] = None,
    state_dir: StateDirOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Read each host's GPUs, PCIe and NUMA layout and RDMA NICs; propose the NIC fields."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.discover import DiscoverOptions  # noqa: PLC0415
    from kit.deploy.discover import discover as run_discover  # noqa: PLC0415
    from kit.deploy.provision import parse_extra_vars  # noqa: PLC0415

    options = DiscoverOptions(
        write=write,
        as_json=as_json,
        extra_vars=parse_extra_vars(extra_vars or []),
        verbose=verbose,
    )
    run_discover(DeployContext.build(_resolve(topology), topology, state_dir), out, options)


@app.command(
    epilog="Examples:\n\n"
    "  pdkit bench topologies/local.yaml --rates 1,4 --requests 40 --out runs/local\n\n"
    "  pdkit bench topologies/local.yaml --search --out runs/search\n\n"
    "  pdkit bench --url http://10.0.0.1:30000 --model llama --concurrency 32 --requests 500\n\n"
    "  pdkit bench compare runs/colocated runs/2p1d --per-gpu --out runs/compare\n\n"
    "Lengths: 512, uniform:256,1024, normal:512,64, lognormal:512,0.5 or hist:FILE (tokens). "
    "Arrivals: poisson, constant or gamma:B (B < 1 burstier). A trace (--trace, Mooncake JSONL: "
    "timestamp ms, input_length, output_length, hash_ids) replays its arrivals, scaled to each "
    "rate. Errors and timeouts count as SLO misses.",
)
def bench(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="TOPOLOGY, or `compare RUN_DIR RUN_DIR ...`.",
            metavar="[TOPOLOGY | compare RUN_DIR...]",
            show_default=False,
        ),
    ] = None,
    *,
    url: Annotated[
        str | None, typer.Option("--url", help="OpenAI-compatible base URL instead of a topology.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model name (with --url).")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env", help="Variable holding the API key (with --url).", metavar="VAR"
        ),
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", help="One rate (requests/s).", show_default=False)
    ] = None,
    rates: Annotated[
        str | None, typer.Option("--rates", help="Rates, e.g. 1,2,4 (requests/s).", metavar="LIST")
    ] = None,
    search: Annotated[
        bool, typer.Option("--search", help="Search the highest rate that meets the SLO.")
    ] = False,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", min=1, help="Closed loop: N users back to back.")
    ] = None,
    requests: Annotated[int, typer.Option("--requests", help="Requests per point.")] = 200,
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="No request goes out later than this (s) in a point."),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(
            "--warmup", help="First requests of each point left out (default 10%, <= 20)."
        ),
    ] = None,
    input_len: InputLenOpt = "512",
    output_len: OutputLenOpt = "64",
    arrivals: ArrivalsOpt = "poisson",
    prefix_share: Annotated[
        float, typer.Option("--prefix-share", help="Share of each prompt its group shares.")
    ] = 0.0,
    prefix_groups: Annotated[
        int, typer.Option("--prefix-groups", help="Groups of prompts with a shared prefix.")
    ] = 0,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Replay a Mooncake-format JSONL trace.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of lengths, arrivals, prompts.")] = 0,
    api: Annotated[str, typer.Option("--api", help="chat or completions.")] = "chat",
    stream: Annotated[
        bool, typer.Option("--stream/--no-stream", help="Stream the answers.")
    ] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per request.")] = 60.0,
    ttft_ms: TtftOpt = None,
    tpot_ms: TpotOpt = None,
    attainment: AttainmentOpt = None,
    start: Annotated[float, typer.Option("--start", help="--search: first rate.")] = 1.0,
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="--search: relative precision.")
    ] = 0.1,
    repeat: Annotated[
        int, typer.Option("--repeat", help="--search: extra runs at the goodput rate.")
    ] = 2,
    max_points: Annotated[int, typer.Option("--max-points", help="--search: at most.")] = 14,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write requests.jsonl, summary.json and PNGs here.", metavar="DIR"
        ),
    ] = None,
    as_json: JsonOpt = False,
    predict: Annotated[
        bool, typer.Option("--predict/--no-predict", help="kit/perf's prediction (topology).")
    ] = True,
    label: Annotated[str, typer.Option("--label", help="Name of this run in compare.")] = "",
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="GPUs of a --url target (per-GPU compare).")
    ] = None,
    per_gpu: Annotated[bool, typer.Option("--per-gpu", help="compare: rates per GPU.")] = False,
) -> None:
    """Measure goodput: load a deployment at rates, or search the highest rate within its SLO."""
    from kit.bench.compare import compare  # noqa: PLC0415
    from kit.bench.options import BenchArgs, options, target  # noqa: PLC0415
    from kit.bench.run import bench as run_bench  # noqa: PLC0415

    positional = list(targets or [])
    if positional[:1] == ["compare"]:
        compare([Path(p) for p in positional[1:]], out_dir or Path("."), out, per_gpu)
        return
    if len(positional) > 1:
        raise PdkitError(f"one topology at most, got {' '.join(positional)}.")
    plan = _resolve(Path(positional[0])) if positional else None
    args = BenchArgs(
        url=url,
        model=model,
        api_key_env=api_key_env,
        rate=rate,
        rates=rates,
        search=search,
        concurrency=concurrency,
        requests=requests,
        duration=duration,
        warmup=warmup,
        input_len=input_len,
        output_len=output_len,
        arrivals=arrivals,
        prefix_share=prefix_share,
        prefix_groups=prefix_groups,
        trace=trace,
        seed=seed,
        api=api,
        stream=stream,
        timeout=timeout,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        attainment=attainment,
        start=start,
        tolerance=tolerance,
        repeat=repeat,
        max_points=max_points,
        out=out_dir,
        as_json=as_json,
        predict=predict,
        label=label,
        gpus=gpus,
    )
    chosen = target(args, plan)
    run = options(args, plan)
    if plan is not None:
        from kit.deploy import DeployContext  # noqa: PLC0415
        from kit.deploy.services import local_pids  # noqa: PLC0415

        # The deployment's processes on this machine: bench reports when they saturate a core.
        hosts = DeployContext.build(plan, Path(positional[0])).hosts
        run = replace(run, watch=local_pids(hosts))
    run_bench(chosen, run, err if as_json else out, plan)


@app.command(
    epilog="Examples:\n\n  pdkit dashboard > pd.json\n\n"
    "  pdkit dashboard topologies/local.yaml > pd.json\n\n"
    "Import the file in Grafana (Dashboards > New > Import) and pick the Prometheus that "
    "`monitoring:` deploys. With a topology, the deployment and the SLO thresholds it shows are "
    "the topology's."
)
def dashboard(
    topology: Annotated[
        Path | None,
        typer.Argument(help="Topology YAML file (optional).", metavar="[TOPOLOGY]"),
    ] = None,
) -> None:
    """Print a Grafana dashboard (JSON) of a PD deployment's Prometheus metrics."""
    from kit.observe.dashboard import dashboard_json  # noqa: PLC0415

    sys.stdout.write(dashboard_json(_resolve(topology) if topology else None))


@app.command(
    epilog="Examples:\n\n  pdkit trace topologies/local.yaml 5f0c2a9e41d7b3c8\n\n"
    "  pdkit trace topologies/local.yaml 3012580135869468599   (a bootstrap room)\n\n"
    "  pdkit trace topologies/local.yaml runs/local/requests.jsonl   (its slowest request)\n\n"
    "REQUEST is the id the router returns in X-Request-Id (pdkit bench records it as "
    "request_id), the bootstrap room (X-PDKit-Bootstrap-Room), or a bench requests.jsonl. The "
    "router's access log names the prefill, the decode and the room; both workers' logs give "
    "each PD stage. Times are ms from the request's arrival at the router."
)
def trace(
    topology: TopologyArg,
    request: Annotated[
        str,
        typer.Argument(
            help="Request id, bootstrap room, or a bench requests.jsonl.",
            metavar="REQUEST_ID|ROOM|REQUESTS.JSONL",
            show_default=False,
        ),
    ],
) -> None:
    """One request's timeline across router, prefill and decode: each phase and the gaps."""
    from kit.deploy import DeployContext  # noqa: PLC0415
    from kit.deploy.trace import trace_request  # noqa: PLC0415
    from kit.observe.trace import trace_lines  # noqa: PLC0415

    context = DeployContext.build(_resolve(topology), topology)
    for line in trace_lines(trace_request(context, request)):
        out.print(line, markup=False, highlight=False)


@app.command(
    epilog="Examples:\n\n"
    "  pdkit size --model meta-llama/Llama-2-13b-hf --gpu A100-80G --gpus 3 --input-len 512 "
    "--output-len 64 --ttft-ms 400 --tpot-ms 40 --emit out.yaml\n\n"
    "  pdkit size topologies/qwen3-2p1d-nicmap.yaml --input-len lognormal:2048,0.6 "
    "--out runs/size\n\n"
    "  pdkit size --model Qwen/Qwen3-32B --gpu H100-SXM --gpus 64 --target-rate 100\n\n"
    "  pdkit size deployed.yaml --calibrate runs/search\n\n"
    "Searches colocated and PD deployments (prefill and decode counts, TP per role, DP "
    "attention and EP for MoE, decode max-running-requests, colocated chunk size) that SGLang "
    "0.5.23 accepts and whose weights and KV fit, each goodput found in kit/perf's virtual "
    "time with the workload's arrivals and lengths (the same options as pdkit bench). With a "
    "topology its hosts (NIC maps kept), engine, transfer, router and SLO are used and kept in "
    "--emit's file; otherwise --gpus N on hosts of --gpus-per-host. --calibrate fits the "
    "model's efficiency factors to a pdkit bench --out run of TOPOLOGY and stores them "
    "($PDKIT_CALIBRATION, default ~/.config/pdkit/calibration.json) for the next pdkit size.",
)
def size(
    topology: Annotated[
        Path | None,
        typer.Argument(
            help="Topology whose hosts to size for (or, with --calibrate, the one measured).",
            metavar="[TOPOLOGY]",
            show_default=False,
        ),
    ] = None,
    *,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model: HF id, config.json path or shipped name."),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU type, e.g. H100-SXM.")] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="GPUs to size for (generic hosts).")
    ] = None,
    gpus_per_host: Annotated[
        int, typer.Option("--gpus-per-host", min=1, help="GPUs per generic host.")
    ] = 8,
    ttft_ms: TtftOpt = None,
    tpot_ms: TpotOpt = None,
    attainment: AttainmentOpt = None,
    input_len: InputLenOpt = "512",
    output_len: OutputLenOpt = "64",
    arrivals: ArrivalsOpt = "poisson",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Size for a Mooncake-format JSONL trace.")
    ] = None,
    requests: Annotated[
        int, typer.Option("--requests", help="Requests per simulated point (at least).")
    ] = 200,
    seed: Annotated[int, typer.Option("--seed", help="Seed of lengths and arrivals.")] = 0,
    target_rate: Annotated[
        float | None,
        typer.Option("--target-rate", help="Find the fewest GPUs that serve R requests/s."),
    ] = None,
    emit: Annotated[
        Path | None,
        typer.Option(
            "--emit", help="Write the chosen PD deployment as a topology.", metavar="FILE"
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Write pareto.png and size.json here.", metavar="DIR"),
    ] = None,
    as_json: JsonOpt = False,
    exhaustive: Annotated[
        bool, typer.Option("--exhaustive", help="Serve every candidate (slow; for checks).")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the table.")] = 10,
    robust: Annotated[
        bool,
        typer.Option("--robustness/--no-robustness", help="Goodput with lengths x2 and x0.5."),
    ] = True,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            "--calibrate", help="Fit the model to this pdkit bench run.", metavar="RUN_DIR"
        ),
    ] = None,
    use_calibration: Annotated[
        bool,
        typer.Option("--calibration/--no-calibration", help="Use the stored calibration."),
    ] = True,
) -> None:
    """Choose prefill:decode counts and parallelism for a model, GPUs, SLO and workload."""
    from kit.sizing.command import SizeArgs  # noqa: PLC0415
    from kit.sizing.command import run as run_size  # noqa: PLC0415

    args = SizeArgs(
        topology=topology,
        model=model,
        gpu=gpu,
        gpus=gpus,
        gpus_per_host=gpus_per_host,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        attainment=attainment,
        input_len=input_len,
        output_len=output_len,
        arrivals=arrivals,
        trace=trace,
        requests=requests,
        seed=seed,
        target_rate=target_rate,
        emit=emit,
        out=out_dir,
        as_json=as_json,
        exhaustive=exhaustive,
        top=top,
        robustness=robust,
        calibrate=calibrate,
        use_calibration=use_calibration,
    )
    run_size(args, err if as_json else out)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except PdkitError as exc:
        if _state["debug"]:
            raise
        err.print(str(exc), markup=False)
        sys.exit(1)
