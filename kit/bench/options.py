"""`pdkit bench`'s options as the CLI receives them -> a target and `BenchOptions`, with a
clear error naming the option for anything wrong."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kit.bench.client import Target
from kit.bench.prompts import Api
from kit.bench.run import BenchOptions
from kit.bench.runner import LoadSpec
from kit.bench.search import SearchSpec
from kit.errors import PdkitError
from kit.perf.workload import WorkloadSpec
from kit.secrets import SecretSource, read_secret
from kit.topology.plan_types import Plan
from kit.topology.schema import SLO


@dataclass(frozen=True)
class BenchArgs:
    """Every option of `pdkit bench`, as given (None: not given)."""

    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    rate: float | None = None
    rates: str | None = None
    search: bool = False
    concurrency: int | None = None
    requests: int = 200
    duration: float | None = None
    warmup: int | None = None
    input_len: str = "512"
    output_len: str = "64"
    arrivals: str = "poisson"
    prefix_share: float = 0.0
    prefix_groups: int = 0
    trace: Path | None = None
    seed: int = 0
    api: str = "chat"
    stream: bool = True
    timeout: float = 60.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    attainment: float | None = None
    start: float = 1.0
    tolerance: float = 0.1
    repeat: int = 2
    max_points: int = 14
    out: Path | None = None
    as_json: bool = False
    predict: bool = True
    label: str = ""
    gpus: int | None = None


def _rates(args: BenchArgs) -> tuple[float, ...]:
    if args.rate is not None:
        return (args.rate,)
    if args.rates is None:
        return ()
    try:
        rates = tuple(float(r) for r in args.rates.split(",") if r.strip())
    except ValueError:
        rates = ()
    if not rates or any(r <= 0 for r in rates):
        raise PdkitError(
            f"--rates {args.rates!r}: give rates above 0 separated by commas, e.g. --rates 1,2,4."
        )
    return rates


def _mode_check(args: BenchArgs) -> None:
    modes = [
        name
        for name, on in (
            ("--rate", args.rate is not None),
            ("--rates", args.rates is not None),
            ("--search", args.search),
            ("--concurrency", args.concurrency is not None),
        )
        if on
    ]
    if len(modes) != 1:
        said = f"got {', '.join(modes)}" if modes else "got none"
        raise PdkitError(
            f"choose one load: --rate R, --rates R1,R2, --search or --concurrency N ({said})."
        )
    if args.rate is not None and args.rate <= 0:
        raise PdkitError("--rate must be above 0 requests/s.")


def target(args: BenchArgs, plan: Plan | None) -> Target:
    """The server to load: the Plan's router, or `--url` with `--model`."""
    if plan is not None:
        if args.url or args.model:
            raise PdkitError("give a topology or --url/--model, not both.")
        router = plan.router
        replicas = ", ".join(plan.router_hosts)
        via = ""
        if plan.vip_url:
            via = f"the router's VIP (replicas {replicas})"
        elif plan.router_hosts:
            via = f"the router replica on {router.host} (of {replicas}; no VIP)"
        pdkit = router.kind == "pdkit"
        return Target(plan.client_url, plan.model.served_name, router.api_key(), pdkit, via)
    if not args.url or not args.model:
        raise PdkitError(
            "give a topology (pdkit bench topologies/local.yaml) or --url URL --model NAME."
        )
    key = None
    if args.api_key_env:
        key = read_secret(SecretSource("--api-key-env", env=args.api_key_env))
    return Target(args.url.rstrip("/").removesuffix("/v1"), args.model, key)


def options(args: BenchArgs, plan: Plan | None) -> BenchOptions:
    """The run `args` ask for; `PdkitError` naming the option otherwise."""
    _mode_check(args)
    if args.api not in ("chat", "completions"):
        raise PdkitError(f"--api {args.api!r}: use chat or completions.")
    if not 0 <= args.prefix_share < 1:
        raise PdkitError("--prefix-share is the shared share of each prompt: 0 <= share < 1.")
    if args.prefix_share > 0 and args.prefix_groups < 1:
        raise PdkitError("--prefix-share needs --prefix-groups N (N >= 1 groups of prompts).")
    if args.requests < 1:
        raise PdkitError("--requests must be at least 1.")
    warmup = args.warmup if args.warmup is not None else min(args.requests // 10, 20)
    if warmup >= args.requests:
        raise PdkitError(f"--warmup {warmup} leaves no request of --requests {args.requests}.")
    workload = WorkloadSpec.from_options(
        input_len=args.input_len,
        output_len=args.output_len,
        arrivals=args.arrivals,
        trace=args.trace,
        count=args.requests,
        seed=args.seed,
    )
    base = plan.slo if plan is not None else SLO()
    slo = SLO(
        ttft_ms=args.ttft_ms or base.ttft_ms,
        tpot_ms=args.tpot_ms or base.tpot_ms,
        attainment=args.attainment or base.attainment,
    )
    api: Api = "chat" if args.api == "chat" else "completions"
    load = LoadSpec(
        api=api,
        stream=args.stream,
        timeout_s=args.timeout,
        warmup=warmup,
        duration_s=args.duration,
        concurrency=args.concurrency,
        prefix_share=args.prefix_share,
        prefix_groups=args.prefix_groups,
        # With a KV pool, ask each answer where its cached prompt tokens came from.
        cache_details=plan is not None and plan.kv_pool is not None,
    )
    search = (
        SearchSpec(
            start=args.start,
            tolerance=args.tolerance,
            repeat=args.repeat,
            max_points=args.max_points,
        )
        if args.search
        else None
    )
    gpus = args.gpus
    if plan is not None and gpus is None:
        gpus = sum(w.parallelism.gpus for w in plan.workers if w.serves_http)
    return BenchOptions(
        workload=workload,
        load=load,
        slo=slo,
        rates=_rates(args),
        search=search,
        out=args.out,
        as_json=args.as_json,
        predict=args.predict and plan is not None,
        label=args.label or (plan.name if plan is not None else ""),
        gpus=gpus,
    )
