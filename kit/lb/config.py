"""The load balancer's settings and its command line.

`parse_args(argv, environ)` is the only way an `LbConfig` is built from the outside: it checks
every option and reads the secrets (API keys come from the environment or a file, never from
the command line, so they do not show in `ps`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from yarl import URL

from kit.lb.errors import LbConfigError
from kit.net import url_host
from kit.secrets import SecretError, SecretSource, read_secret
from kit.topology import ports
from kit.topology.policies import DEFAULT_POLICIES, PDKIT_POLICIES
from kit.topology.schema import SLO

Role = Literal["prefill", "decode"]

POLICIES = ("round_robin", "random", "least_inflight", "prefix_affinity", "cache_aware")
PREFILL_ONLY_POLICIES = frozenset(PDKIT_POLICIES["prefill"]) - frozenset(PDKIT_POLICIES["decode"])
DEFAULT_PREFILL_POLICY = DEFAULT_POLICIES["pdkit"]["prefill"]
DEFAULT_DECODE_POLICY = DEFAULT_POLICIES["pdkit"]["decode"]

API_KEY_ENV = "PDKIT_LB_API_KEY"
ADMIN_KEY_ENV = "PDKIT_LB_ADMIN_KEY"
WORKER_KEY_ENV = "PDKIT_LB_WORKER_API_KEY"

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker as configured: base URL (no trailing slash) and, for prefill, its bootstrap port.

    `bootstrap_port` None means "not given": decode then uses its own
    `--disaggregation-bootstrap-port`.
    """

    url: str
    role: Role
    bootstrap_port: int | None = None

    @property
    def bootstrap_host(self) -> str:
        """Host part of the URL as the decode must dial it (IPv6 in brackets)."""
        return url_host(URL(self.url).raw_host or "")


@dataclass(frozen=True, slots=True)
class LbConfig:
    """Everything the load balancer needs; durations in seconds, sizes in bytes."""

    prefill: tuple[WorkerSpec, ...]
    decode: tuple[WorkerSpec, ...]
    host: str = "0.0.0.0"
    port: int = ports.ROUTER
    prefill_policy: str = DEFAULT_PREFILL_POLICY
    decode_policy: str = DEFAULT_DECODE_POLICY
    api_key: str | None = field(default=None, repr=False)
    admin_key: str | None = field(default=None, repr=False)
    worker_api_key: str | None = field(default=None, repr=False)
    # Timeouts per phase (0 disables the one that allows it).
    connect_timeout: float = 5.0
    prefill_timeout: float = 600.0
    idle_timeout: float = 300.0
    request_timeout: float = 3600.0
    # Worker health.
    health_interval: float = 5.0
    health_timeout: float = 5.0
    health_path: str = "/health"
    eject_after: int = 3
    readmit_after: int = 2
    eject_backoff: float = 1.0
    eject_backoff_max: float = 30.0
    # Requests. A failure before the client got a byte is retried on a fresh pair, and a
    # stream whose decode dies or stalls is migrated, `retries` times in all per request, and
    # no new attempt starts `retry_deadline` s after arrival. A request that finds no routable
    # worker of a role waits up to `hold_timeout` s for one (at most `hold_max` at once).
    retries: int = 3
    retry_deadline: float = 60.0
    hold_timeout: float = 5.0
    hold_max: int = 256
    # At most this many requests out on one prefill (0: no limit); the rest wait here, in
    # arrival order, for the first prefill with room (late binding: a prefill that joins, or
    # one that frees, takes the oldest waiting request instead of queueing behind its peers).
    prefill_max_inflight: int = 0
    eject_after_failures: int = 3
    # Streams: the longest wait for the first token (0: --idle-timeout), and for each later
    # one (0: derived from the TPOT objective, `stall_timeout_for`).
    first_token_timeout: float = 30.0
    stall_timeout: float = 0.0
    migrate: bool = True
    max_body_bytes: int = 64 * MIB
    drain_grace: float = 30.0
    prefix_chars: int = 256
    affinity_load_factor: float = 1.25
    # cache_aware: the prompt tokenizer ("sim:VOCAB", or "" for input_ids only) and when a
    # worker's events count as stopped (kit.lb.kv_index).
    prompt_tokens: str = ""
    kv_silence: float = 5.0
    kv_silence_requests: int = 8
    # cache_aware: the longest a routed request's blocks count as pending on its prefill rank
    # before its KV events report them (kit.lb.kv_index).
    kv_pending_timeout: float = 30.0
    # A worker whose probe times out while it still finishes requests stays in for this long.
    busy_grace: float = 20.0
    # Upstream connection pool.
    max_connections: int = 0
    upstream_keepalive: float = 4.0
    # SLO-aware admission (off by default); SLO targets in seconds.
    admission: bool = False
    slo_ttft: float = SLO().ttft_ms / 1000
    slo_tpot: float = SLO().tpot_ms / 1000
    admission_margin: float = 0.2
    admission_poll: float = 1.0
    access_log: bool = True
    log_level: str = "info"
    seed: int | None = None

    @property
    def stall_after(self) -> float:
        """Seconds without a token after which a stream is stalled (migrated or ended)."""
        return self.stall_timeout or stall_timeout_for(self.slo_tpot)


STALL_TPOTS = 50
MIN_STALL = 2.0


def stall_timeout_for(tpot: float) -> float:
    """The default stall timeout (s) for a TPOT objective of `tpot` s: 50 token times, at
    least 2 s (a decode step that long is a stopped worker, not a busy one)."""
    return max(STALL_TPOTS * tpot, MIN_STALL)


EPILOG = """\
examples:
  # one prefill (bootstrap port 8998) and one decode, on this host
  python -m kit.lb --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30100

  # two prefills, two decodes, explicit policies, clients must send a key
  export PDKIT_LB_API_KEY=$(cat /etc/pdkit/api-key)
  python -m kit.lb --prefill http://10.0.0.1:30000 8998 --prefill http://10.0.0.1:30001 8999 \\
      --decode http://10.0.0.2:30100 --decode http://10.0.0.2:30101 \\
      --prefill-policy prefix_affinity --decode-policy least_inflight --port 8000

  # admission: answer 429 at once to requests predicted to miss a 400 ms TTFT / 40 ms TPOT SLO
  python -m kit.lb --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30100 \\
      --admission --slo-ttft-ms 400 --slo-tpot-ms 40

  # from a topology (pdkit renders the same options from the Plan)
  pdkit lb --topology topologies/local.yaml

keys (never on the command line):
  PDKIT_LB_API_KEY / --api-key-file        clients send `Authorization: Bearer KEY`
  PDKIT_LB_ADMIN_KEY / --admin-key-file    enables /workers (add, remove with drain, list)
  PDKIT_LB_WORKER_API_KEY / --worker-api-key-file   sent to workers started with --api-key

policies: round_robin, random, least_inflight (power of two choices on in-flight requests),
  prefix_affinity (prefill only: same prompt prefix -> same prefill, bounded by load),
  cache_aware (prefill only: the prefill DP rank with the least prefill work for this prompt,
  counting what its KV events say it has cached; see kit/lb/cache_aware.py)

access log: one line per PD request on stderr, `access {json}` (logger kit.lb.access); off with
  --no-access-log
"""


class _WorkerAction(argparse.Action):
    """`--prefill URL [PORT|none]` and `--decode URL`, repeatable."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        items = [str(v) for v in (values or [])]
        role: Role = "prefill" if self.dest == "prefill" else "decode"
        limit = 2 if role == "prefill" else 1
        if not items or len(items) > limit:
            usage = "URL [BOOTSTRAP_PORT|none]" if role == "prefill" else "URL"
            parser.error(f"{option_string} takes {usage}, got {' '.join(items) or 'nothing'}")
        port: int | None = None
        if len(items) == 2 and items[1].lower() != "none":
            try:
                port = int(items[1])
            except ValueError:
                parser.error(
                    f"{option_string} {items[0]}: bootstrap port {items[1]!r} is not a "
                    "number; give a port such as 8998, or none"
                )
            if not 1 <= port <= 65535:
                parser.error(f"{option_string} {items[0]}: bootstrap port {port} is out of range")
        specs = list(getattr(namespace, self.dest) or [])
        specs.append(WorkerSpec(normalize_url(items[0], parser), role, port))
        setattr(namespace, self.dest, specs)


class _RefuseSecret(argparse.Action):
    """A key on the command line would show in `ps` and shell history: say where it goes."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        env = {"--api-key": API_KEY_ENV, "--admin-key": ADMIN_KEY_ENV}.get(
            option_string or "", WORKER_KEY_ENV
        )
        parser.error(
            f"{option_string} is not taken on the command line (it would show in ps); "
            f"set ${env} or use {option_string}-file PATH"
        )


def normalize_url(raw: str, parser: argparse.ArgumentParser | None = None) -> str:
    """`http(s)://host:port[/prefix]` without a trailing slash; raises LbConfigError otherwise."""
    try:
        url = URL(raw)
    except ValueError:
        url = URL()
    if url.scheme not in ("http", "https") or not url.raw_host:
        message = f"worker URL {raw!r} must look like http://HOST:PORT"
        if parser is not None:
            parser.error(message)
        raise LbConfigError(message + ". To fix: give the worker's HTTP address.")
    return str(url).rstrip("/")


def _positive(
    kind: type[float] | type[int], allow_zero: bool = False
) -> Callable[[str], float | int]:
    def check(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"{text} must be {'>= 0' if allow_zero else '> 0'}")
        return value

    return check


def build_parser(prog: str = "pdkit lb") -> argparse.ArgumentParser:
    """The argparse parser; defaults come from `LbConfig`."""
    d = LbConfig(prefill=(), decode=())
    p = argparse.ArgumentParser(
        prog=prog,
        description="pdkit's prefill/decode load balancer for SGLang PD disaggregation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        usage=f"{prog} --prefill URL [BOOTSTRAP_PORT|none] ... --decode URL ... [options]",
    )
    p.add_argument(
        "--api-key", "--admin-key", "--worker-api-key", action=_RefuseSecret, help=argparse.SUPPRESS
    )
    w = p.add_argument_group("workers")
    w.add_argument(
        "--prefill",
        action=_WorkerAction,
        nargs="+",
        metavar=("URL", "BOOTSTRAP_PORT"),
        default=[],
        help="prefill worker URL, then its bootstrap port, or none (decode then uses its own "
        "default); repeat per prefill",
    )
    w.add_argument(
        "--decode",
        action=_WorkerAction,
        nargs=1,
        metavar="URL",
        default=[],
        help="decode worker URL; repeat per decode",
    )
    w.add_argument(
        "--prefill-policy",
        choices=POLICIES,
        default=d.prefill_policy,
        help=f"prefill selection (default {d.prefill_policy})",
    )
    w.add_argument(
        "--decode-policy",
        choices=POLICIES,
        default=d.decode_policy,
        help=f"decode selection (default {d.decode_policy})",
    )
    s = p.add_argument_group("server")
    s.add_argument("--host", default=d.host, help=f"bind address (default {d.host})")
    s.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port})")
    s.add_argument(
        "--api-key-file", type=Path, help=f"file with the client key (or ${API_KEY_ENV})"
    )
    s.add_argument(
        "--admin-key-file",
        type=Path,
        help=f"file with the /workers admin key (or ${ADMIN_KEY_ENV})",
    )
    s.add_argument(
        "--worker-api-key-file",
        type=Path,
        help=f"file with the key sent to workers (or ${WORKER_KEY_ENV})",
    )
    s.add_argument(
        "--max-body-mb",
        type=_positive(float),
        default=d.max_body_bytes / MIB,
        help=f"largest request body, MiB (default {d.max_body_bytes // MIB})",
    )
    s.add_argument(
        "--drain-grace",
        type=_positive(float, True),
        default=d.drain_grace,
        help=f"on SIGTERM, seconds to let in-flight requests finish (default {d.drain_grace:g})",
    )
    s.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=d.access_log,
        help="one `access {json}` line per PD request on stderr (default on)",
    )
    s.add_argument(
        "--log-level",
        default=d.log_level,
        choices=("debug", "info", "warning", "error"),
        help="default info",
    )
    t = p.add_argument_group("timeouts (seconds; 0 = none where allowed)")
    t.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=d.connect_timeout,
        help=f"TCP connect to a worker (default {d.connect_timeout:g})",
    )
    t.add_argument(
        "--prefill-timeout",
        type=_positive(float, True),
        default=d.prefill_timeout,
        help=f"whole prefill leg (default {d.prefill_timeout:g})",
    )
    t.add_argument(
        "--idle-timeout",
        type=_positive(float, True),
        default=d.idle_timeout,
        help=f"longest wait for the next bytes of a decode response (default {d.idle_timeout:g})",
    )
    t.add_argument(
        "--request-timeout",
        type=_positive(float, True),
        default=d.request_timeout,
        help=f"whole request, streams included (default {d.request_timeout:g})",
    )
    h = p.add_argument_group("worker health")
    h.add_argument(
        "--health-interval",
        type=_positive(float),
        default=d.health_interval,
        help=f"seconds between probes of each worker (default {d.health_interval:g})",
    )
    h.add_argument(
        "--health-timeout",
        type=_positive(float),
        default=d.health_timeout,
        help=f"probe timeout (default {d.health_timeout:g})",
    )
    h.add_argument("--health-path", default=d.health_path, help=f"default {d.health_path}")
    h.add_argument(
        "--eject-after",
        type=_positive(int),
        default=d.eject_after,
        help=f"consecutive failed probes to eject (default {d.eject_after})",
    )
    h.add_argument(
        "--readmit-after",
        type=_positive(int),
        default=d.readmit_after,
        help=f"consecutive good probes to readmit (default {d.readmit_after})",
    )
    h.add_argument(
        "--busy-grace",
        type=_positive(float, True),
        default=d.busy_grace,
        help="a probe that times out does not count against a worker that finished a request "
        f"or streamed within this many seconds (default {d.busy_grace:g}, SGLang's own health "
        "window; 0 = every timeout counts)",
    )
    h.add_argument(
        "--eject-backoff",
        type=_positive(float),
        default=d.eject_backoff,
        help=f"first ejection after a connection error, doubling per repeat "
        f"(default {d.eject_backoff:g})",
    )
    h.add_argument(
        "--eject-backoff-max",
        type=_positive(float),
        default=d.eject_backoff_max,
        help=f"longest such ejection (default {d.eject_backoff_max:g})",
    )
    r = p.add_argument_group("routing")
    r.add_argument(
        "--retries",
        type=_positive(int, True),
        default=d.retries,
        help="attempts after the first, per request: a failure before the client got a byte "
        "(connection refused or reset, a 5xx, a transfer failure, no first token) is sent "
        f"again on a fresh pair, a stream cut mid-way is migrated (default {d.retries})",
    )
    r.add_argument(
        "--retry-deadline",
        type=_positive(float),
        default=d.retry_deadline,
        help="seconds after arrival past which no new attempt starts "
        f"(default {d.retry_deadline:g})",
    )
    r.add_argument(
        "--hold-timeout",
        type=_positive(float, True),
        default=d.hold_timeout,
        help="a request that finds no healthy prefill or decode waits this many seconds for "
        f"one, then gets a 503 with Retry-After (default {d.hold_timeout:g}; 0 = no hold)",
    )
    r.add_argument(
        "--hold-max",
        type=_positive(int, True),
        default=d.hold_max,
        help=f"requests held at once; more get the 503 at once (default {d.hold_max})",
    )
    r.add_argument(
        "--prefill-max-inflight",
        type=_positive(int, True),
        default=d.prefill_max_inflight,
        help="requests out on one prefill at most; more wait in the router, oldest first, "
        "for the first prefill with room, so a prefill that joins or frees takes waiting "
        "work (default 0: no limit, every request goes to a prefill at once)",
    )
    r.add_argument(
        "--eject-after-failures",
        type=_positive(int),
        default=d.eject_after_failures,
        help="failed requests in a row that eject a worker for a growing backoff "
        f"(--eject-backoff); never the last one of its role (default {d.eject_after_failures})",
    )
    r.add_argument(
        "--first-token-timeout",
        type=_positive(float, True),
        default=d.first_token_timeout,
        help="streams: longest wait for the decode's first bytes before the request is sent "
        f"again elsewhere (default {d.first_token_timeout:g}; 0 = --idle-timeout)",
    )
    r.add_argument(
        "--stall-timeout",
        type=_positive(float, True),
        default=d.stall_timeout,
        help=f"streams: seconds without a token after which the stream is stalled: migrated "
        f"(or ended); default 0 = {STALL_TPOTS} x --slo-tpot-ms, at least {MIN_STALL:g} s",
    )
    r.add_argument(
        "--migrate",
        action=argparse.BooleanOptionalAction,
        default=d.migrate,
        help="continue a stream whose decode died or stalled on another pair, where the "
        "continuation is exact (default on)",
    )
    r.add_argument(
        "--prefix-chars",
        type=_positive(int),
        default=d.prefix_chars,
        help=f"prompt characters that form the prefix_affinity key "
        f"(default {d.prefix_chars}; a quarter as many token ids)",
    )
    r.add_argument(
        "--affinity-load-factor",
        type=_positive(float),
        default=d.affinity_load_factor,
        help=f"prefix_affinity leaves a worker above this multiple of the mean "
        f"in-flight load (default {d.affinity_load_factor:g})",
    )
    r.add_argument(
        "--prompt-tokens",
        default=d.prompt_tokens,
        help="cache_aware: how to get a text prompt's token ids: sim:VOCAB (the emulated "
        "model's tokenizer); default: only /generate input_ids are hashed",
    )
    r.add_argument(
        "--kv-silence",
        type=_positive(float),
        default=d.kv_silence,
        help=f"cache_aware: seconds after which a worker that got --kv-silence-requests "
        f"requests and sent no KV event is routed as if uncached (default {d.kv_silence:g})",
    )
    r.add_argument(
        "--kv-silence-requests",
        type=_positive(int),
        default=d.kv_silence_requests,
        help=f"see --kv-silence (default {d.kv_silence_requests})",
    )
    r.add_argument(
        "--kv-pending-timeout",
        type=_positive(float),
        default=d.kv_pending_timeout,
        help=f"cache_aware: seconds a routed request's prompt blocks count as cached on its "
        f"prefill rank at most, until that rank's KV events report them; its failed prefill "
        f"ends them sooner (default {d.kv_pending_timeout:g})",
    )
    r.add_argument(
        "--max-connections",
        type=_positive(int, True),
        default=d.max_connections,
        help="cap on pooled upstream connections (default 0 = no cap)",
    )
    r.add_argument(
        "--upstream-keepalive",
        type=_positive(float),
        default=d.upstream_keepalive,
        help=f"seconds an idle upstream connection is kept; keep it below the "
        f"workers' own keep-alive (uvicorn: 5) (default {d.upstream_keepalive:g})",
    )
    r.add_argument("--seed", type=int, help="seed for random choices and bootstrap rooms (tests)")
    a = p.add_argument_group("admission (SLO-aware: 429 at once for requests predicted to miss)")
    a.add_argument(
        "--admission",
        action="store_true",
        help="refuse requests whose predicted TTFT or TPOT misses the SLO (default off)",
    )
    a.add_argument(
        "--slo-ttft-ms",
        type=_positive(float),
        default=d.slo_ttft * 1000,
        help=f"time to first token target, ms (default {d.slo_ttft * 1000:g})",
    )
    a.add_argument(
        "--slo-tpot-ms",
        type=_positive(float),
        default=d.slo_tpot * 1000,
        help=f"time per output token target, ms (default {d.slo_tpot * 1000:g})",
    )
    a.add_argument(
        "--admission-margin",
        type=_positive(float, True),
        default=d.admission_margin,
        help="share of the SLO kept free for prediction error: normal requests may use "
        "1 - margin of it, low 1 - 2 x margin, high all of it "
        f"(default {d.admission_margin:g})",
    )
    a.add_argument(
        "--admission-poll",
        type=_positive(float),
        default=d.admission_poll,
        help=f"seconds between reads of the workers' /v1/loads (default {d.admission_poll:g})",
    )
    return p


def _read_secret(
    path: Path | None, option: str, env_name: str, environ: Mapping[str, str]
) -> str | None:
    """A key from `option`'s file, else from `env_name` (optional)."""
    source = SecretSource(option, file=path, env=env_name, required=False)
    try:
        return read_secret(source, environ)
    except SecretError as exc:
        raise LbConfigError(str(exc)) from exc


def argv_problem(argv: Sequence[str]) -> str | None:
    """Why this router command line would not start (None when it would), without exiting:
    lets `pdkit validate` check a topology's `router.args` before anything is deployed.
    Key files are not read (they live on the router host)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            unknown = build_parser().parse_known_args(list(argv))[1]
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines()
        return lines[-1].split("error: ", 1)[-1] if lines else "invalid arguments"
    if unknown:
        return f"unrecognized arguments: {' '.join(unknown)}"
    try:
        parse_args(argv, environ={})
    except LbConfigError as exc:
        if not isinstance(exc.__cause__, SecretError):  # key files live on the router host
            return str(exc)
    return None


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> LbConfig:
    """Parse and check a command line; argparse exits with status 2 on malformed options."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv) if argv is not None else None)
    prefill: list[WorkerSpec] = ns.prefill
    decode: list[WorkerSpec] = ns.decode
    if not prefill or not decode:
        raise LbConfigError(
            "need at least one --prefill URL [BOOTSTRAP_PORT] and one "
            "--decode URL. To fix: list the workers, or use --topology."
        )
    urls = [w.url for w in (*prefill, *decode)]
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise LbConfigError(f"worker listed twice: {', '.join(dupes)}. To fix: list each once.")
    if ns.decode_policy in PREFILL_ONLY_POLICIES:
        raise LbConfigError(
            f"--decode-policy {ns.decode_policy} is for prefill only (decode "
            "holds no prompt cache). To fix: use least_inflight."
        )
    if not 1 <= ns.port <= 65535:
        raise LbConfigError(f"--port {ns.port} is out of range 1-65535.")
    if ns.eject_backoff_max < ns.eject_backoff:
        raise LbConfigError("--eject-backoff-max must be at least --eject-backoff.")
    if ns.affinity_load_factor < 1.0:
        raise LbConfigError("--affinity-load-factor must be >= 1 (1 = perfectly even load).")
    if ns.prompt_tokens and not _sim_vocab(ns.prompt_tokens):
        raise LbConfigError(
            f"--prompt-tokens {ns.prompt_tokens!r}: expected sim:VOCAB (a positive integer). "
            "To fix: use sim:VOCAB, or leave it out (input_ids only)."
        )
    if not ns.health_path.startswith("/"):
        raise LbConfigError(f"--health-path {ns.health_path!r} must start with '/'.")
    if ns.admission_margin >= 0.5:
        raise LbConfigError(
            f"--admission-margin {ns.admission_margin:g} leaves low-priority requests no "
            "share of the SLO. To fix: use a margin below 0.5 (0.2 by default)."
        )
    return LbConfig(
        prefill=tuple(prefill),
        decode=tuple(decode),
        host=ns.host,
        port=ns.port,
        prefill_policy=ns.prefill_policy,
        decode_policy=ns.decode_policy,
        api_key=_read_secret(ns.api_key_file, "--api-key-file", API_KEY_ENV, env),
        admin_key=_read_secret(ns.admin_key_file, "--admin-key-file", ADMIN_KEY_ENV, env),
        worker_api_key=_read_secret(
            ns.worker_api_key_file, "--worker-api-key-file", WORKER_KEY_ENV, env
        ),
        connect_timeout=ns.connect_timeout,
        prefill_timeout=ns.prefill_timeout,
        idle_timeout=ns.idle_timeout,
        request_timeout=ns.request_timeout,
        health_interval=ns.health_interval,
        health_timeout=ns.health_timeout,
        health_path=ns.health_path,
        eject_after=ns.eject_after,
        readmit_after=ns.readmit_after,
        eject_backoff=ns.eject_backoff,
        eject_backoff_max=ns.eject_backoff_max,
        retries=ns.retries,
        retry_deadline=ns.retry_deadline,
        hold_timeout=ns.hold_timeout,
        hold_max=ns.hold_max,
        prefill_max_inflight=ns.prefill_max_inflight,
        eject_after_failures=ns.eject_after_failures,
        first_token_timeout=ns.first_token_timeout,
        stall_timeout=ns.stall_timeout,
        migrate=ns.migrate,
        max_body_bytes=int(ns.max_body_mb * MIB),
        drain_grace=ns.drain_grace,
        prefix_chars=ns.prefix_chars,
        affinity_load_factor=ns.affinity_load_factor,
        prompt_tokens=ns.prompt_tokens,
        kv_silence=ns.kv_silence,
        kv_silence_requests=ns.kv_silence_requests,
        kv_pending_timeout=ns.kv_pending_timeout,
        max_connections=ns.max_connections,
        upstream_keepalive=ns.upstream_keepalive,
        busy_grace=ns.busy_grace,
        admission=ns.admission,
        slo_ttft=ns.slo_ttft_ms / 1000,
        slo_tpot=ns.slo_tpot_ms / 1000,
        admission_margin=ns.admission_margin,
        admission_poll=ns.admission_poll,
        access_log=ns.access_log,
        log_level=ns.log_level,
        seed=ns.seed,
    )


def _sim_vocab(spec: str) -> int | None:
    """VOCAB of a --prompt-tokens sim:VOCAB, else None."""
    kind, _, vocab = spec.partition(":")
    return int(vocab) if kind == "sim" and vocab.isdigit() and int(vocab) > 0 else None


def prompt_vocab(config: LbConfig) -> int | None:
    """The sim tokenizer's vocabulary size, when the router hashes text prompts with it."""
    return _sim_vocab(config.prompt_tokens) if config.prompt_tokens else None
