"""Judge one worker from its answers: pure, no I/O (`evaluate_worker(answers, ...) -> status`).

State, from `/health` first:

    down       nothing answers: connection refused, no route, or no TCP connection in time
    starting   /health says 503 and nothing runs (SGLang loads the model and warms up)
    draining   /health says 503 while requests still run (SGLang is shutting down), or the
               router stopped sending it new requests (set in kit.observe.report)
    joining    healthy, and the router has just been given it (`pdkit up` adding or replacing
               it): routed to after its first good health probe (set in kit.observe.report)
    unhealthy  connected but no answer in time, any other status, or a server that is not
               what the topology expects at that port (model, disaggregation mode, engine,
               SGLang version, bootstrap port, TP size)
    healthy    /health says 200 and /server_info matches the topology

The numbers come from `/v1/loads?include=all` (per DP rank, summed) with `/metrics` as the
fallback, and the counters and histograms (KV transfer failures and latency) from `/metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from kit.errors import ProbeError
from kit.observe.probe import Fetched, WorkerAnswers
from kit.observe.prom import Histogram, MetricSet, parse_metrics
from kit.observe.targets import Expected, WorkerTarget

State = Literal["down", "starting", "healthy", "unhealthy", "draining", "joining"]

KV_LATENCY = "sglang:kv_transfer_latency_ms"
KV_SPEED = "sglang:kv_transfer_speed_gb_s"
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
BOOTSTRAP_FAILED = "sglang:num_bootstrap_failed_reqs_total"

# /v1/loads `disaggregation` field -> the /metrics gauge with the same meaning.
PD_QUEUES = {
    "bootstrap": ("prefill_bootstrap_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs"),
    "inflight": ("prefill_inflight_queue_reqs", "sglang:num_prefill_inflight_queue_reqs"),
    "prealloc": ("decode_prealloc_queue_reqs", "sglang:num_decode_prealloc_queue_reqs"),
    "transfer": ("decode_transfer_queue_reqs", "sglang:num_decode_transfer_queue_reqs"),
}
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
TOKEN_USAGE, GEN_THROUGHPUT = "sglang:token_usage", "sglang:gen_throughput"
PROCESS_START = "process_start_time_seconds"
FAMILIES = frozenset(
    {KV_LATENCY, KV_SPEED, TRANSFER_FAILED, BOOTSTRAP_FAILED, RUNNING, QUEUED, TOKEN_USAGE}
    | {GEN_THROUGHPUT, PROCESS_START}
    | {metric for _, metric in PD_QUEUES.values()}
)
"""The /metrics families status reads (the rest of a worker's page is skipped unparsed)."""


@dataclass(frozen=True)
class KvTransfer:
    """KV cache transfer between prefill and decode, as this worker counts it.

    `latency_ms` is the mean transfer latency (ms) and `transfers` their number over `window`
    ("since start", "last round" in `--watch`, or "latest": the scheduler's last value);
    `speed_gb_s` GB/s; the failure counts are since the worker started.
    """

    latency_ms: float | None = None
    speed_gb_s: float | None = None
    transfers: int | None = None
    failed: int | None = None
    bootstrap_failed: int | None = None
    window: str = "since start"


@dataclass(frozen=True)
class WorkerStatus:
    """Everything status shows about one worker instance; numbers are None when unknown.

    `token_usage` is the KV cache share in use (0..1, the fullest DP rank); `gen_throughput`
    tokens/s; `uptime_s` seconds; queue lengths in requests.
    """

    name: str
    role: str
    instance: int
    host: str
    endpoint: str
    nnodes: int
    state: State
    cause: str = ""
    node_rank: int = 0
    """> 0: another node of a multi-node instance (it serves /health and /metrics only)."""
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    engine: str | None = None
    version: str | None = None
    served_model: str | None = None
    uptime_s: float | None = None
    running: int | None = None
    queued: int | None = None
    token_usage: float | None = None
    pd_queues: dict[str, int | None] = field(default_factory=dict)
    kv: KvTransfer = field(default_factory=KvTransfer)
    gen_throughput: float | None = None
    health_ms: float | None = None

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"


SIM_ENGINE_NAMES = frozenset({"pdkit-sim", "sim"})


def detect_engine(server_info: dict[str, Any]) -> str:
    """`sim` for pdkit's emulated worker, else `sglang` (or what an unknown server calls itself).

    The sim says so in /server_info (`"engine": "pdkit-sim"`, next to the SGLang `version` it
    emulates); SGLang's /server_info has no `engine` key.
    """
    engine = server_info.get("engine")
    if isinstance(engine, str) and engine:
        return "sim" if engine in SIM_ENGINE_NAMES else engine
    return "sglang"


def reported_version(server_info: dict[str, Any]) -> str | None:
    """The SGLang version the worker runs (the sim: the SGLang version it emulates)."""
    for key in ("sglang_version", "version"):
        value = server_info.get(key)
        if isinstance(value, str) and value:
            return value.split("+", 1)[0]
    return None


def mismatches(server_info: dict[str, Any], expected: Expected) -> list[str]:
    """How the server at this port differs from what the topology says runs there."""
    found: list[str] = []
    served = _served(server_info)
    if served is not None and served != expected.served_model:
        found.append(f"serves model {served!r}, the topology expects {expected.served_model!r}")
    mode = server_info.get("disaggregation_mode")
    if mode is not None and str(mode) != expected.mode:
        found.append(
            f"runs with disaggregation mode {mode!r}, the topology expects {expected.mode!r}"
        )
    engine = detect_engine(server_info)
    if engine != expected.engine:
        found.append(f"is engine {engine!r}, the topology expects {expected.engine!r}")
    version = reported_version(server_info)
    if version is not None and version != expected.sglang_version:
        found.append(f"runs SGLang {version}, the topology expects {expected.sglang_version}")
    port = server_info.get("disaggregation_bootstrap_port")
    if expected.bootstrap_port is not None and port is not None and port != expected.bootstrap_port:
        found.append(
            f"has bootstrap port {port}, the topology (and the router) expect "
            f"{expected.bootstrap_port}"
        )
    tp = server_info.get("tp_size")
    if isinstance(tp, int) and tp != expected.tp_size:
        found.append(f"runs with tp_size {tp}, the topology expects {expected.tp_size}")
    return found


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _rank_loads(loads: Fetched) -> list[dict[str, Any]]:
    """The per-DP-rank entries of a /v1/loads answer (empty when unusable)."""
    body = loads.json()
    entries = body.get("loads") if isinstance(body, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _sum(entries: list[dict[str, Any]], key: str, section: str | None = None) -> int | None:
    values = [_int((e.get(section) or {}).get(key) if section else e.get(key)) for e in entries]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _uptime(server_info: dict[str, Any], metrics: MetricSet | None, now: float) -> float | None:
    """Seconds since the server started: the sim's start time, else process metrics.

    The sim reports when it started (`sim.started_at`, epoch s). SGLang's `startup_time` is a
    dict of startup phase durations, which says nothing about when: SGLang's uptime comes from
    process metrics if it has them, else it is unknown.
    """
    nested = server_info.get("sim")
    started = _float(nested.get("started_at")) if isinstance(nested, dict) else None
    if started is None and metrics is not None:
        started = metrics.maximum(PROCESS_START)
    return max(now - started, 0.0) if started is not None else None


def _engine_page(body: str) -> bool:
    """The /metrics page is an SGLang worker's (the sim's too): it has `sglang:` families."""
    return "\nsglang:" in body or body.startswith("sglang:")


def _kv(
    metrics: MetricSet | None,
    entries: list[dict[str, Any]],
    earlier: MetricSet | None,
    *,
    engine_page: bool,
) -> KvTransfer:
    latency: Histogram | None = None
    speed: Histogram | None = None
    window = "since start"
    if metrics is not None:
        latency, speed = metrics.histogram(KV_LATENCY), metrics.histogram(KV_SPEED)
        if earlier is not None and latency is not None:
            recent = latency.since(earlier.histogram(KV_LATENCY))
            if recent.count > 0:
                latency, window = recent, "last round"
                if speed is not None:
                    speed = speed.since(earlier.histogram(KV_SPEED))
    latency_ms = latency.mean if latency is not None else None
    speed_gb_s = speed.mean if speed is not None else None
    if metrics is not None and latency is None:  # a gauge: the last transfer (0 before any)
        latency_ms = metrics.maximum(KV_LATENCY) or None
        speed_gb_s = metrics.maximum(KV_SPEED) or None
        window = "latest"
    if latency_ms is None and entries:  # the scheduler's latest value, per DP rank
        values = [
            _float((e.get("disaggregation") or {}).get("kv_transfer_latency_ms")) for e in entries
        ]
        known = [v for v in values if v]
        latency_ms = max(known) if known else None
        window = "latest"
    failed = bootstrap_failed = None
    if metrics is not None and engine_page:
        # A labelled counter shows no sample before its first increment: absent means 0. A
        # real decode's page (hundreds of sglang: lines) may hold none of the families status
        # reads until its scheduler has logged a batch, so the page itself says it is SGLang's.
        failed = _int(metrics.total(TRANSFER_FAILED) or 0)
        bootstrap_failed = _int(metrics.total(BOOTSTRAP_FAILED) or 0)
    return KvTransfer(
        latency_ms=latency_ms,
        speed_gb_s=speed_gb_s,
        transfers=_int(latency.count) if latency is not None else None,
        failed=failed,
        bootstrap_failed=bootstrap_failed,
        window=window,
    )


@dataclass(frozen=True)
class _Load:
    running: int | None
    queued: int | None
    token_usage: float | None
    gen_throughput: float | None
    pd_queues: dict[str, int | None]


_T = TypeVar("_T")


def _either(value: _T | None, fallback: _T | None) -> _T | None:
    return value if value is not None else fallback


def _load(entries: list[dict[str, Any]], metrics: MetricSet | None) -> _Load:
    """Load numbers from /v1/loads (summed over DP ranks; KV usage of the fullest), with the
    /metrics gauges filling what it did not say."""
    gauges = metrics if metrics is not None else MetricSet(())
    usage = [v for v in (_float(e.get("token_usage")) for e in entries) if v is not None]
    throughput = [v for v in (_float(e.get("gen_throughput")) for e in entries) if v is not None]
    return _Load(
        running=_either(_sum(entries, "num_running_reqs"), _int(gauges.total(RUNNING))),
        queued=_either(_sum(entries, "num_waiting_reqs"), _int(gauges.total(QUEUED))),
        token_usage=max(usage) if usage else gauges.maximum(TOKEN_USAGE),
        gen_throughput=math.fsum(throughput) if throughput else gauges.total(GEN_THROUGHPUT),
        pd_queues={
            name: _either(_sum(entries, field_name, "disaggregation"), _int(gauges.total(metric)))
            for name, (field_name, metric) in PD_QUEUES.items()
        },
    )


def _state_from_health(health: Fetched, busy: int) -> tuple[State, str]:
    if health.failure in ("refused", "unreachable", "connect_timeout"):
        return "down", health.detail
    if health.failure == "timeout":
        return "unhealthy", f"/health: {health.detail}"
    if health.failure is not None or health.status is None:
        return "unhealthy", f"/health: {health.detail or 'no answer'}"
    if health.status == 200:
        return "healthy", ""
    if health.status == 503:
        if busy > 0:
            return "draining", f"/health says 503 while {busy} request(s) still run (shutting down)"
        return "starting", "starting: /health says 503 (loading the model or warming up)"
    return "unhealthy", f"/health answered HTTP {health.status}"


def evaluate_worker(
    answers: WorkerAnswers, now: float, earlier: WorkerAnswers | None = None
) -> WorkerStatus:
    """The status of one worker from one probe round (`now`: wall-clock seconds).

    `earlier` is the previous round's answers in `--watch`, for windowed latency.
    """
    target: WorkerTarget = answers.target
    notes: list[str] = []
    metrics = earlier_metrics = None
    if answers.metrics.ok:
        try:
            metrics = parse_metrics(answers.metrics.body, FAMILIES)
        except ProbeError as exc:
            notes.append(f"/metrics: {exc}")
    elif answers.metrics.status == 404:
        notes.append("/metrics is off (launch with --enable-metrics)")
    elif answers.metrics.failure not in (None, "skipped"):
        notes.append(f"/metrics: {answers.metrics.why}")  # the KV columns stay blank
    if earlier is not None and earlier.metrics.ok:
        try:
            earlier_metrics = parse_metrics(earlier.metrics.body, FAMILIES)
        except ProbeError:
            earlier_metrics = None
    entries = _rank_loads(answers.loads)
    info = answers.server_info.json()
    server_info: dict[str, Any] = info if isinstance(info, dict) else {}
    load = _load(entries, metrics)
    running, queued = load.running, load.queued

    state, cause = _state_from_health(answers.health, (running or 0) + (queued or 0))
    problems = [cause] if cause else []
    if answers.health.answered and not target.follower:
        if server_info:
            wrong = mismatches(server_info, target.expected)
            if wrong:
                state = "unhealthy"
                problems = [f"not what the topology expects: {w}" for w in wrong] + problems
                cause = problems[0]
        elif answers.server_info.status in (404, 405):
            if state == "healthy":
                state = "unhealthy"
                cause = "answers /health but has no /server_info: not an SGLang server?"
                problems = [cause]
        elif state == "healthy":
            why = answers.server_info.why
            if answers.server_info.status == 401:
                why += " (it needs the worker's --api-key)"
            notes.append(f"/server_info: {why}; model, mode and version not checked")
        if state == "healthy" and not entries and metrics is None:
            notes.append("no load numbers: /v1/loads and /metrics did not answer")

    return WorkerStatus(
        name=target.name,
        role=target.role,
        instance=target.instance,
        host=target.host,
        endpoint=target.endpoint,
        nnodes=target.nnodes,
        state=state,
        cause=cause,
        node_rank=target.node_rank,
        problems=tuple(problems),
        notes=tuple(notes),
        engine=detect_engine(server_info) if server_info else None,
        version=reported_version(server_info) if server_info else None,
        served_model=_served(server_info),
        uptime_s=_uptime(server_info, metrics, now),
        running=running,
        queued=queued,
        token_usage=load.token_usage,
        pd_queues=load.pd_queues,
        kv=_kv(metrics, entries, earlier_metrics, engine_page=_engine_page(answers.metrics.body)),
        gen_throughput=load.gen_throughput,
        health_ms=answers.health.seconds * 1000 if answers.health.answered else None,
    )


def _served(server_info: dict[str, Any]) -> str | None:
    """The model name clients use (SGLang defaults it to the model path)."""
    served = server_info.get("served_model_name") or server_info.get("model_path")
    if isinstance(served, list):  # a list of aliases: the first is the name
        served = served[0] if served else None
    return str(served) if served is not None else None
