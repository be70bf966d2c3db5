"""pdkit's router options, declared once: each field of `RouterOptions` is one option.

An entry gives the option's name (the `LbConfig` attribute), its type (the annotation), its
default, and in `option(...)` its help, the unit its flag takes, the checks on its value, the
topology value the Plan renders for it (`plan`) and smg's equivalent (`smg`). From this table:

1. `kit.lb.config` builds the router's argparse parser and `LbConfig` (a subclass);
2. `kit.plan.router` renders pdkit's router flags and smg's from a topology;
3. `option_problems` checks a set of values: the router's at start-up, and the ones the Plan
   would give it (`pdkit validate`), so that nothing parses a rendered argv back.

The workers (`--prefill`, `--decode`) and the key files are not options but what the router is
given (`kit.lb.config`); they are named here (`WORKER_FLAGS`, `KEY_FILES`) so that a topology's
`router.args` can be told so. Options with a typed topology key (`router.faults`,
`router.admission`) take their default from the schema. Adding one: docs/development.md.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass

from kit.net import bare_host
from kit.topology import ports
from kit.topology.client_limits import format_limits, limits_problem, parse_limits
from kit.topology.policies import DEFAULT_POLICIES, PDKIT_POLICIES
from kit.topology.router_flags import (
    EJECT_BACKOFF_MAX,
    MIN_STALL,
    SAME,
    SIM_WORKERS,
    STALL_TPOTS,
    RouterOption,
    Smg,
    backoff_max,
    chat_bridge,
    faults,
    handoff_at_least,
    model_tokenizer,
    option,
    policy,
    smg_breaker_open,
    smg_breaker_threshold,
    smg_request_timeout,
    smg_retries,
    stall,
    stall_timeout_for,
    with_admission,
    worker_context_length,
)
from kit.topology.router_schema import Admission, Canary, Faults
from kit.topology.schema import SLO

POLICIES = ("round_robin", "random", "least_inflight", "prefix_affinity", "cache_aware")
PREFILL_ONLY_POLICIES = frozenset(PDKIT_POLICIES["prefill"]) - frozenset(PDKIT_POLICIES["decode"])
LOG_LEVELS = ("debug", "info", "warning", "error")
MIB = 1024 * 1024
PREFILL_TIMEOUT = 600.0
REQUEST_TIMEOUT = 3600.0

WORKER_FLAGS = ("--prefill", "--decode")
"""The worker list: the Plan renders it from the topology's instances."""
KEY_FILES = {
    "--api-key-file": "PDKIT_LB_API_KEY",
    "--admin-key-file": "PDKIT_LB_ADMIN_KEY",
    "--worker-api-key-file": "PDKIT_LB_WORKER_API_KEY",
}
"""Key file flag -> the variable that holds the key otherwise. A key itself is never an
option (`--api-key` would show in ps): the router reads it from the file or the variable."""

GROUPS = {
    "workers": "workers",
    "server": "server",
    "timeouts": "timeouts (seconds; 0 = none where allowed)",
    "health": "worker health",
    "routing": "routing",
    "admission": "admission (SLO-aware: 429 at once for requests predicted to miss)",
}
"""Help sections, in the order `--help` shows them."""

_SLO = SLO()
_FAULTS = Faults()
_ADMISSION = Admission()
_CANARY = Canary()


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterOptions:
    """The router's options; durations in seconds, sizes in bytes. The order is the order the
    Plan renders them in (a change of order would restart every deployed router)."""

    # Where it listens and how it picks workers: rendered for both routers, always.
    host: str = option(
        "0.0.0.0",
        "bind address (default {default})",
        group="server",
        plan=lambda t: bare_host(t.router.bind),
        always=True,
        smg=SAME,
    )
    port: int = option(
        ports.ROUTER,
        "port (default {default})",
        group="server",
        plan=lambda t: t.router.port,
        always=True,
        smg=SAME,
    )
    prefill_policy: str = option(
        DEFAULT_POLICIES["pdkit"]["prefill"],
        "prefill selection (default {default})",
        group="workers",
        choices=POLICIES,
        plan=policy("prefill"),
        always=True,
        smg=SAME,
    )
    decode_policy: str = option(
        DEFAULT_POLICIES["pdkit"]["decode"],
        "decode selection (default {default})",
        group="workers",
        choices=POLICIES,
        plan=policy("decode"),
        always=True,
        smg=SAME,
    )
    # SLO-aware admission (router.admission; off by default).
    admission: bool = option(
        False,
        "refuse requests whose predicted TTFT or TPOT misses the SLO (default off)",
        group="admission",
        plan=with_admission(lambda t: True),
        always=True,
    )
    slo_ttft: float = option(
        _SLO.ttft_ms / 1000,
        "time to first token target, ms (default {default})",
        group="admission",
        unit="ms",
        scale=0.001,
        flag="--slo-ttft-ms",
        bound="> 0",
        plan=with_admission(lambda t: (t.router.admission.ttft_ms or t.slo.ttft_ms) / 1000),
        always=True,
    )
    slo_tpot: float = option(
        _SLO.tpot_ms / 1000,
        "time per output token target, ms (default {default})",
        group="admission",
        unit="ms",
        scale=0.001,
        flag="--slo-tpot-ms",
        bound="> 0",
        plan=with_admission(lambda t: (t.router.admission.tpot_ms or t.slo.tpot_ms) / 1000),
        always=True,
    )
    admission_margin: float = option(
        _ADMISSION.margin,
        "share of the SLO kept free for prediction error: normal requests may use "
        "1 - margin of it, low 1 - 2 x margin, high all of it (default {default})",
        group="admission",
        bound=">= 0",
        plan=with_admission(lambda t: t.router.admission.margin),
        always=True,
    )
    # Timeouts per phase (0 disables the one that allows it).
    prefill_timeout: float = option(
        PREFILL_TIMEOUT,
        "whole prefill leg (default {default})",
        group="timeouts",
        unit="s",
        bound=">= 0",
        plan=handoff_at_least(PREFILL_TIMEOUT),
    )
    request_timeout: float = option(
        REQUEST_TIMEOUT,
        "whole request, streams included (default {default})",
        group="timeouts",
        unit="s",
        bound=">= 0",
        plan=handoff_at_least(REQUEST_TIMEOUT),
        smg=Smg(("--request-timeout-secs",), smg_request_timeout),
    )
    # Requests (router.faults). A failure before the client got a byte is retried on a fresh
    # pair, and a stream whose decode dies or stalls is migrated, `retries` times in all per
    # request, and no new attempt starts `retry_deadline` s after arrival. A request that finds
    # no routable worker of a role waits up to `hold_timeout` s for one (at most `hold_max`).
    retries: int = option(
        _FAULTS.retries,
        "attempts after the first, per request: a failure before the client got a byte "
        "(connection refused or reset, a 5xx, a transfer failure, no first token) is sent "
        "again on a fresh pair, a stream cut mid-way is migrated (default {default})",
        group="routing",
        bound=">= 0",
        plan=faults("retries"),
        smg=Smg(
            ("--retry-max-retries", "--disable-retries", "--retry-initial-backoff-ms"),
            smg_retries,
        ),
    )
    retry_deadline: float = option(
        _FAULTS.retry_deadline_s,
        "seconds after arrival past which no new attempt starts (default {default})",
        group="routing",
        unit="s",
        bound="> 0",
        plan=faults("retry_deadline_s"),
    )
    eject_after_failed_requests: int = option(
        _FAULTS.eject_after_failures,
        "failed requests in a row that eject a worker for a growing backoff "
        "(--eject-backoff); never the last one of its role (default {default})",
        group="routing",
        flag="--eject-after-failed-requests",
        aliases=("--eject-after-failures",),
        # The spelling deployed routers run with: another would restart them on an upgrade.
        rendered="--eject-after-failures",
        bound="> 0",
        plan=faults("eject_after_failures"),
        smg=Smg(("--cb-failure-threshold",), smg_breaker_threshold),
    )
    hold_timeout: float = option(
        _FAULTS.hold_timeout_s,
        "a request that finds no healthy prefill or decode waits this many seconds for "
        "one, then gets a 503 with Retry-After (default {default}; 0 = no hold)",
        group="routing",
        unit="s",
        bound=">= 0",
        plan=faults("hold_timeout_s"),
    )
    # Streams: the longest wait for the first token (0: --idle-timeout), and for each later
    # one (0: derived from the TPOT objective, `stall_timeout_for`).
    first_token_timeout: float = option(
        _FAULTS.first_token_timeout_s,
        "streams: longest wait for the decode's first bytes before the request is sent "
        "again elsewhere (default {default}; 0 = --idle-timeout)",
        group="routing",
        unit="s",
        bound=">= 0",
        plan=faults("first_token_timeout_s"),
    )
    stall_timeout: float = option(
        0.0,
        "streams: seconds without a token after which the stream is stalled: migrated "
        f"(or ended); default 0 = {STALL_TPOTS} x --slo-tpot-ms, at least {MIN_STALL:g} s",
        group="routing",
        unit="s",
        bound=">= 0",
        plan=stall,
    )
    eject_backoff: float = option(
        _FAULTS.eject_backoff_s,
        "first ejection after a connection error, doubling per repeat (default {default})",
        group="health",
        unit="s",
        bound="> 0",
        plan=faults("eject_backoff_s"),
        smg=Smg(("--cb-timeout-duration-secs",), smg_breaker_open),
    )
    eject_backoff_max: float = option(
        EJECT_BACKOFF_MAX,
        "longest such ejection (default {default})",
        group="health",
        unit="s",
        bound="> 0",
        plan=backoff_max,
    )
    migrate: bool = option(
        _FAULTS.migrate,
        "continue a stream whose decode died or stalled on another pair, where the "
        "continuation is exact (default on)",
        group="routing",
        plan=faults("migrate"),
    )
    # The token canary (router.canary; kit.lb.canary).
    canary_interval: float = option(
        _CANARY.interval_s,
        "seconds between rounds of the token canary: one short greedy request per prefill x "
        "decode pair, off the users' path, tokens compared across the pairs; a worker every "
        "one of whose pairs disagrees with the majority is taken out until they agree again "
        "(default {default}; 0 = off)",
        group="health",
        unit="s",
        bound=">= 0",
        plan=lambda t: t.router.canary.interval_s,
    )
    # Options a topology sets only through `router.args`.
    connect_timeout: float = option(
        5.0, "TCP connect to a worker (default {default})", group="timeouts", unit="s", bound="> 0"
    )
    idle_timeout: float = option(
        300.0,
        "longest wait for the next bytes of a decode response (default {default})",
        group="timeouts",
        unit="s",
        bound=">= 0",
    )
    max_body_bytes: int = option(
        64 * MIB,
        "largest request body, MiB (default {default})",
        group="server",
        unit="MiB",
        scale=MIB,
        flag="--max-body-mb",
        bound="> 0",
    )
    drain_grace: float = option(
        30.0,
        "on SIGTERM, seconds to let in-flight requests finish (default {default})",
        group="server",
        unit="s",
        bound=">= 0",
    )
    access_log: bool = option(
        True,
        "one `access {{json}}` line per PD request on stderr (default on)",
        group="server",
    )
    log_level: str = option("info", "default {default}", group="server", choices=LOG_LEVELS)
    health_interval: float = option(
        5.0,
        "seconds between probes of each worker (default {default})",
        group="health",
        unit="s",
        bound="> 0",
    )
    health_timeout: float = option(
        5.0, "probe timeout (default {default})", group="health", unit="s", bound="> 0"
    )
    health_path: str = option("/health", "default {default}", group="health")
    eject_after_failed_probes: int = option(
        3,
        "consecutive failed probes to eject (default {default})",
        group="health",
        flag="--eject-after-failed-probes",
        aliases=("--eject-after",),
        bound="> 0",
    )
    readmit_after: int = option(
        2, "consecutive good probes to readmit (default {default})", group="health", bound="> 0"
    )
    # A worker whose probe times out while it still finishes requests stays in for this long.
    busy_grace: float = option(
        20.0,
        "a probe that times out does not count against a worker that finished a request "
        "or streamed within this many seconds (default {default}, SGLang's own health "
        "window; 0 = every timeout counts)",
        group="health",
        unit="s",
        bound=">= 0",
    )
    hold_max: int = option(
        256,
        "requests held at once; more get the 503 at once (default {default})",
        group="routing",
        bound=">= 0",
    )
    # At most this many requests out on one prefill (0: no limit); the rest wait here, in
    # arrival order, for the first prefill with room (late binding: a prefill that joins, or
    # one that frees, takes the oldest waiting request instead of queueing behind its peers).
    prefill_max_inflight: int = option(
        0,
        "requests out on one prefill at most; more wait in the router, oldest first, "
        "for the first prefill with room, so a prefill that joins or frees takes waiting "
        "work (default 0: no limit, every request goes to a prefill at once)",
        group="routing",
        bound=">= 0",
    )
    prefix_chars: int = option(
        256,
        "prompt characters that form the prefix_affinity key (default {default}; a quarter "
        "as many token ids)",
        group="routing",
        bound="> 0",
    )
    affinity_load_factor: float = option(
        1.25,
        "prefix_affinity leaves a worker above this multiple of the mean in-flight load "
        "(default {default})",
        group="routing",
        bound="> 0",
    )
    # The prompt tokenizer ("model:PATH", "sim:VOCAB", or "" for input_ids only): the Plan
    # gives the served model's folder (`model_tokenizer`). Then when a worker's events count
    # as stopped (kit.lb.kv_index).
    prompt_tokens: str = option(
        "",
        "how to get a text prompt's token ids (cache_aware, request checks, token counts, "
        "cut streams continued): model:PATH (the served model's tokenizer from the folder "
        "PATH, as SGLang 0.5.23 tokenizes), sim:VOCAB (the emulated model's) or sim (the "
        "emulated model's, its vocabulary from the workers' /server_info); default: only token "
        "ids a client sent are known, other prompts are estimated",
        group="routing",
        plan=model_tokenizer,
    )
    # The checks before any worker sees a request (kit.lb.validate).
    validate: bool = option(
        True,
        "refuse with a 400, before any worker sees it, a request SGLang 0.5.23 would crash on "
        "or refuse: token ids outside the vocabulary, a prompt past the context, prompt + "
        "max_tokens past it (default on; off only to test what the workers do)",
        group="routing",
    )
    # A chat stream followed through /v1/completions (kit.lb.openai_stream), unless the
    # workers parse chat output that completions does not (the Plan turns it off then).
    chat_bridge: bool = option(
        True,
        "follow a streamed chat's token ids by sending it to the workers as /v1/completions "
        "with the router's chat template, so that a stream cut by a dead decode goes on "
        "exactly; off, chats go to the workers' own /v1/chat/completions (needed when they run "
        "--reasoning-parser or --tool-call-parser: completions does not parse reasoning or "
        "tool calls; the Plan turns it off then) and a cut chat stream ends with an error",
        group="routing",
        plan=chat_bridge,
    )
    context_length: int = option(
        0,
        "tokens of context the request checks use (default 0: the served model's config.json, "
        "with --prompt-tokens model:PATH; otherwise lengths are left to the workers)",
        group="routing",
        bound=">= 0",
        plan=worker_context_length,
    )
    kv_silence: float = option(
        5.0,
        "cache_aware: seconds after which a worker that got --kv-silence-requests requests "
        "and sent no KV event is routed as if uncached (default {default})",
        group="routing",
        unit="s",
        bound="> 0",
    )
    kv_silence_requests: int = option(
        8, "see --kv-silence (default {default})", group="routing", bound="> 0"
    )
    # cache_aware: the longest a routed request's blocks count as pending on its prefill rank
    # before its KV events report them (kit.lb.kv_index).
    kv_pending_timeout: float = option(
        30.0,
        "cache_aware: seconds a routed request's prompt blocks count as cached on its "
        "prefill rank at most, until that rank's KV events report them; its failed prefill "
        "ends them sooner (default {default})",
        group="routing",
        unit="s",
        bound="> 0",
    )
    # Upstream connection pool.
    max_connections: int = option(
        0,
        "cap on pooled upstream connections (default 0 = no cap)",
        group="routing",
        bound=">= 0",
    )
    upstream_keepalive: float = option(
        4.0,
        "seconds an idle upstream connection is kept; keep it below the workers' own "
        "keep-alive (uvicorn: 5) (default {default})",
        group="routing",
        unit="s",
        bound="> 0",
    )
    seed: int | None = option(
        None, "seed for random choices and bootstrap rooms (tests)", group="routing"
    )
    # Several processes on the port (router.processes; kit.lb.processes).
    processes: int = option(
        1,
        "router processes sharing the port (SO_REUSEPORT), one core each; the limits that "
        "count requests at once (--prefill-max-inflight, --hold-max) are split between them, "
        "client buckets (--client-limits) shared (default {default})",
        group="server",
        bound="> 0",
        plan=lambda t: t.router.processes,
    )
    # TLS on the client port (router.tls): files on the router host, read again on SIGHUP.
    tls_cert: str = option(
        "",
        "TLS on the client port: the PEM certificate chain's file (with --tls-key); read "
        "again on SIGHUP without dropping connections (default: plain HTTP)",
        group="server",
        plan=lambda t: t.router.tls.cert_file if t.router.tls else None,
    )
    tls_key: str = option(
        "",
        "the PEM private key's file, for --tls-cert",
        group="server",
        plan=lambda t: t.router.tls.key_file if t.router.tls else None,
    )
    # Limits per client (router.limits): token buckets keyed by the SHA-256 of the API key.
    client_limits: str = option(
        "",
        "token buckets per client: NAME=SHA256:REQUESTS_PER_S:PROMPT_TOKENS_PER_S:BURST_S, "
        "comma-separated; SHA256 is the hex SHA-256 of the client's API key (a rate of 0: no "
        "limit of that kind); a client over a limit gets 429 with Retry-After (default none)",
        group="server",
        plan=lambda t: format_limits(t.router.limits) or None,
    )
    admission_poll: float = option(
        1.0,
        "seconds between reads of the workers' /v1/loads (default {default})",
        group="admission",
        unit="s",
        bound="> 0",
    )

    @property
    def stall_after(self) -> float:
        """Seconds without a token after which a stream is stalled (migrated or ended)."""
        return self.stall_timeout or stall_timeout_for(self.slo_tpot)


def _entries() -> tuple[RouterOption, ...]:
    hints = typing.get_type_hints(RouterOptions)
    out = []
    for f in dataclasses.fields(RouterOptions):
        hint = hints[f.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kind = next(m for m in members if m is not type(None))
        entry: RouterOption = f.metadata["option"]
        flag = entry.flag or "--" + f.name.replace("_", "-")
        typed = dataclasses.replace(
            entry,
            name=f.name,
            kind=kind,
            optional=type(None) in members,
            default=f.default,
            flag=flag,
            # As argparse names it from the flag; the choices show for themselves.
            metavar=entry.metavar
            or (None if entry.choices else flag[2:].upper().replace("-", "_")),
        )
        out.append(
            dataclasses.replace(typed, help=entry.help.format(default=typed.text(f.default)))
        )
    return tuple(out)


DEFAULTS = RouterOptions()
ROUTER_OPTIONS = _entries()
"""Every option, in the order the Plan renders them."""
BY_FLAG = {spelling: o for o in ROUTER_OPTIONS for spelling in o.spellings}
"""Each spelling of a flag -> its option."""


def sim_from_workers(spec: str) -> bool:
    """--prompt-tokens sim: the emulated model's tokenizer, with the vocabulary its workers'
    /server_info reports (`SIM_WORKERS`)."""
    return spec == SIM_WORKERS


def sim_vocab(spec: str) -> int | None:
    """VOCAB of a --prompt-tokens sim:VOCAB, else None."""
    kind, _, vocab = spec.partition(":")
    return int(vocab) if kind == "sim" and vocab.isdigit() and int(vocab) > 0 else None


def model_tokenizer_path(spec: str) -> str | None:
    """PATH of a --prompt-tokens model:PATH, else None."""
    kind, _, path = spec.partition(":")
    return path if kind == "model" and path else None


def option_problems(values: RouterOptions) -> list[str]:
    """Why the router would refuse these values (each says how to fix), in table order;
    empty when it would start with them."""
    problems = [p for o in ROUTER_OPTIONS if (p := o.problem(getattr(values, o.name))) is not None]
    if not 1 <= values.port <= 65535:
        problems.append(f"--port {values.port} is out of range 1-65535.")
    if values.decode_policy in PREFILL_ONLY_POLICIES:
        problems.append(
            f"--decode-policy {values.decode_policy} is for prefill only (decode "
            "holds no prompt cache). To fix: use least_inflight."
        )
    if values.eject_backoff_max < values.eject_backoff:
        problems.append("--eject-backoff-max must be at least --eject-backoff.")
    if values.affinity_load_factor < 1.0:
        problems.append("--affinity-load-factor must be >= 1 (1 = perfectly even load).")
    spec = values.prompt_tokens
    known = sim_vocab(spec) or model_tokenizer_path(spec) or sim_from_workers(spec)
    if spec and not known:
        problems.append(
            f"--prompt-tokens {spec!r}: expected model:PATH (the model's folder), sim:VOCAB "
            "(a positive integer) or sim. To fix: use one, or leave it out (token ids only)."
        )
    if values.client_limits:
        try:
            problem = limits_problem(parse_limits(values.client_limits))
        except ValueError as exc:
            problem = str(exc)
        if problem:
            problems.append(f"--client-limits: {problem}.")
    if bool(values.tls_cert) != bool(values.tls_key):
        problems.append(
            "--tls-cert and --tls-key go together. To fix: give both files, or neither."
        )
    n = values.processes
    for name, value in (
        ("--prefill-max-inflight", values.prefill_max_inflight),
        ("--hold-max", values.hold_max),
    ):
        if n > 1 and 0 < value < n:
            problems.append(
                f"{name} {value} cannot be split over --processes {n} (each process holds a "
                f"share). To fix: set it to at least {n}, or run fewer processes."
            )
    if not values.health_path.startswith("/"):
        problems.append(f"--health-path {values.health_path!r} must start with '/'.")
    if values.admission_margin >= 0.5:
        problems.append(
            f"--admission-margin {values.admission_margin:g} leaves low-priority requests no "
            "share of the SLO. To fix: use a margin below 0.5 (0.2 by default)."
        )
    return problems
