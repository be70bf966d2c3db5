"""`pdkit autoscale`'s foreground loop: every interval, scrape, judge, decide, log, apply.

One interval:
    scrape     the router's worker list (which role each instance serves, which are routed)
               and metrics, every instance's /metrics (`kit.observe.probe.Prober`)
    observe    the interval's mix and latencies from this scrape and the last
               (`kit.autoscale.observe`); an interval with fewer than `min_requests` finished
               leaves the forecast as it was
    correct    kit/perf's efficiency factors fitted to the observed latencies
               (`kit.autoscale.model`)
    forecast   the next interval's mix (`kit.autoscale.forecast`)
    decide     over the allowed splits' predicted goodputs (`kit.autoscale.decide`)
    log        one block per interval: the decision and its reason, the observed and
               forecast mix, the corrections, every candidate's predicted goodput; also a JSON
               line in the state folder's ``autoscale.jsonl`` and the record ``autoscale.json``
               that `pdkit status` shows
    apply      (unless --dry-run) the role switch, or the live redeploy (`kit.autoscale.apply`)

A change is in flight while the deployment lock is held (a `pdkit up`, `restart` or `down`, or
this loop's own switch) or an instance does not serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rich.console import Console

from kit.autoscale import record as records
from kit.autoscale.apply import RoleSwitcher, current_roles, redeploy, splits
from kit.autoscale.decide import Decision, Inputs, Limits, Memory, Mix, Split, candidates, decide
from kit.autoscale.forecast import forecast
from kit.autoscale.model import PoolModel
from kit.autoscale.observe import Interval, Scrape, arrival_shift, interval
from kit.bench.predict import plan_cluster
from kit.deploy.routing import Routed, RouterAdmin
from kit.deploy.steps import router_key
from kit.errors import DeployError, PdkitError
from kit.hosts.context import DeployContext
from kit.observe.probe import Fetched, Prober, auth_headers
from kit.observe.prom import MetricSet, parse_metrics
from kit.observe.targets import targets_from_plan
from kit.perf.timing import Efficiency
from kit.plan.resolve import resolve
from kit.topology.load import parse_topology, read_topology_text
from kit.topology.place import role_switchable
from kit.topology.schema import Topology

LOG = "autoscale.jsonl"
TICK_S = 1.0
"""Seconds between two looks at the router's arrival counters within an interval."""


@dataclass(frozen=True)
class LoopOptions:
    """The command line: `interval_s` (None: the topology's), --dry-run, --once (one decision
    from two scrapes `interval_s` apart, then exit), --metrics-port (0: none)."""

    interval_s: float | None = None
    dry_run: bool = False
    once: bool = False
    metrics_port: int = 0
    state_base: Path | None = None
    drain_timeout: float | None = None


def load_topology(topology_file: Path) -> Topology:
    topology, _ = parse_topology(read_topology_text(topology_file), str(topology_file))
    if topology.autoscale is None:
        raise PdkitError(
            f"{topology_file}: autoscale: is not set, so pdkit autoscale has no bounds to keep "
            "to. To fix: add `autoscale: {}` (defaults) or its keys (docs/topology.md)."
        )
    return topology


class Autoscaler:
    """The loop's state: the Plan it reads, the model, the engine's memory, the last scrape."""

    def __init__(self, topology_file: Path, options: LoopOptions, console: Console) -> None:
        self.topology_file = topology_file
        self.options = options
        self.console = console
        self.topology = load_topology(topology_file)
        self.limits = Limits.of(self.topology)
        self._use(topology_file)
        cluster, speed = plan_cluster(self.plan)
        assert cluster.prefill is not None and cluster.decode is not None  # a PD Plan
        self.model = PoolModel(
            cluster.prefill.config,
            cluster.decode.config,
            self.topology.slo,
            self.topology,
            speed,
            Efficiency.for_gpu(cluster.prefill.config.gpu),
        )
        self.switch = role_switchable(self.topology, "prefill") and role_switchable(
            self.topology, "decode"
        )
        self.memory = Memory()
        self.predicted: Mix | None = None
        self.previous: Scrape | None = None
        self.early: str | None = None
        """Why the interval under way ended before its time (`shifted`), for its log."""
        self.answered: dict[str, MetricSet] = {}
        """Each worker's last answered /metrics since the last change: a worker that did not
        answer the previous scrape counts its interval from its last answer (a loaded worker's
        /metrics can time out, and the interval after would otherwise see nothing of it)."""
        self.last: records.DecisionRecord | None = records.load(self.ctx.state_dir)

    @property
    def interval_s(self) -> float:
        assert self.topology.autoscale is not None
        return self.options.interval_s or self.topology.autoscale.interval_s

    def _use(self, topology_file: Path) -> None:
        self.plan = resolve(topology_file, state_base=self.options.state_base)
        self.ctx = DeployContext.build(self.plan, topology_file, self.options.state_base)

    # -- scrape ----------------------------------------------------------------------------

    async def _scrape(self) -> tuple[Scrape, dict[str, Routed]]:
        targets = targets_from_plan(self.plan)
        router = self.plan.router
        async with RouterAdmin(router.kind, router.url, router_key(self.ctx), 5.0) as admin:
            routed = await admin.workers()
        async with Prober(timeout=10.0) as prober:
            answers = await prober.round(targets)
        at = time.monotonic()
        workers = {w.target.name: _parsed(w.metrics) for w in answers.workers}
        router_metrics = _parsed(answers.router.metrics)
        return Scrape(at, router_metrics, workers), routed

    async def _roles(self) -> dict[str, str]:
        """The role each instance serves now (after a move)."""
        router = self.plan.router
        async with RouterAdmin(router.kind, router.url, router_key(self.ctx), 5.0) as admin:
            return current_roles(self.plan, await admin.workers())

    def in_flight(self) -> str | None:
        """What change runs now: the deployment lock's holder (see the module doc)."""
        lock = self.ctx.state_dir / "lock"
        if not lock.exists():
            return None
        with open(lock, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                return (
                    f"a pdkit up/restart/down holds the deployment lock ({handle.read().strip()})"
                )
            fcntl.flock(handle, fcntl.LOCK_UN)
        return None

    # -- one interval ----------------------------------------------------------------------

    def step(self) -> records.DecisionRecord:
        """Scrape, decide, log and (unless --dry-run) apply; the record of the interval."""
        scrape, routed = asyncio.run(self._scrape())
        current, serving = splits(self.plan, routed)
        roles = current_roles(self.plan, routed)
        assert self.topology.autoscale is not None
        if self.previous is None:
            seen = Interval(0.0, 0, None, None)
        else:
            before = self.previous.filled(self.answered)
            answers = self.predicted.output_tokens if self.predicted is not None else None
            seen = interval(
                before,
                scrape,
                roles,
                self.plan.router.kind,
                self.topology.slo,
                output_tokens=answers,
            )
        self.previous = scrape
        self.answered.update({w: m for w, m in scrape.workers.items() if m is not None})
        enough = seen.mix is not None and seen.samples >= self.limits.min_requests
        observed = seen.mix if enough else None
        fit = (
            "not fitted (the workload shifted: the latencies are the old one's)"
            if seen.shifted
            else "not fitted (too few requests)"
        )
        if observed is not None and seen.observed is not None:
            corrected = self.model.correct(current, observed, seen.observed)
            fit = (
                f"fitted: latency error {corrected.error_before:.0%} -> {corrected.error_after:.0%}"
                if corrected.fitted
                else f"kept: latency error {corrected.error_before:.0%}"
            )
        self.predicted = forecast(
            self.predicted, observed, reset=self.limits.tolerance(seen.samples)
        )
        allowed = candidates(self.limits, current, serving) if self.predicted else []
        goodput = self.model.goodputs(allowed, self.predicted) if self.predicted else {}
        inputs = Inputs(
            now_s=time.time(),
            observed=observed,
            requests=seen.samples,
            forecast=self.predicted,
            current=current,
            serving=serving,
            goodput=goodput,
            in_flight=self.in_flight(),
            stalled=seen.stalled,
        )
        decision, self.memory = decide(self.limits, self.memory, inputs)
        applied = None
        if decision.action == "move":
            applied = "dry run: not applied" if self.options.dry_run else self._apply(decision)
            if not self.options.dry_run:
                roles = asyncio.run(self._roles())
        rec = records.DecisionRecord.of(
            decision,
            at=time.time(),
            interval=seen.describe()
            + (f"; ended early: {early}" if (early := self.early) is not None else ""),
            observed=observed,
            forecast=self.predicted,
            efficiency=asdict(self.model.efficiency),
            fit=fit,
            mispredicted=self.memory.mispredicted,
            roles=roles,
            applied=applied,
            dry_run=self.options.dry_run,
        )
        self._log(rec, goodput, decision)
        self.early = None
        self.last = rec
        return rec

    def _apply(self, decision: Decision) -> str:
        began = time.monotonic()
        try:
            if self.switch:
                moved = RoleSwitcher(self.ctx, self.options.drain_timeout).move(
                    decision.current, decision.target
                )
                text = "switched " + "; ".join(m.line() for m in moved)
            else:
                derived = redeploy(
                    self.topology_file, decision.target, self.console, self.options.state_base
                )
                self._use(derived)
                text = f"redeployed live from {derived.name}"
        except PdkitError as exc:
            # Failed moves count as changes: the cooldown keeps a broken move from repeating.
            return f"applying failed after {time.monotonic() - began:.1f} s: {exc}"
        # The interval under way straddles the change: start measuring afresh.
        self.previous = None
        self.answered = {}
        return f"{text} in {time.monotonic() - began:.1f} s"

    def _log(
        self, rec: records.DecisionRecord, goodput: dict[Split, float], decision: Decision
    ) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(rec.at))
        style = {"move": "bold green", "paused": "bold red"}.get(rec.action, "bold")
        self.console.print(f"[{style}]{stamp} {rec.line()}[/]", highlight=False)
        rated = ", ".join(
            f"{s.describe()} {g:.2f}"
            + (" (current)" if s == decision.current else "")
            + (" (chosen)" if s == decision.target and decision.action == "move" else "")
            for s, g in sorted(goodput.items())
        )
        eff = rec.efficiency
        lines = [
            f"observed: {rec.interval}",
            "forecast: "
            + (Mix(**rec.forecast).describe() if rec.forecast else "none yet")
            + (f" (last forecast off by {rec.error:.0%})" if rec.error is not None else ""),
            f"corrections: compute {eff['compute']:.3f}, memory {eff['memory']:.3f} ({rec.fit})",
            f"predicted goodput (req/s): {rated or 'not evaluated'}",
        ]
        for line in lines:
            self.console.print(f"  {line}", markup=False, highlight=False)
        records.save(self.ctx.state_dir, rec)
        with open(self.ctx.state_dir / LOG, "a") as log:
            log.write(
                json.dumps(
                    {**asdict(rec), "goodput": {s.describe(): g for s, g in goodput.items()}}
                )
                + "\n"
            )

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        with self._metrics_server():
            mode = (
                "dry run: decisions are logged, not applied"
                if self.options.dry_run
                else (
                    "applies through the runtime role switch"
                    if self.switch
                    else "applies by drain, stop and start (pdkit up)"
                )
            )
            self.console.print(
                f"[bold]pdkit autoscale[/] {self.plan.name}: every {self.interval_s:g} s, "
                f"{mode}; bounds prefill [{self.limits.prefill_min}, {self.limits.prefill_max}], "
                f"decode [{self.limits.decode_min}, {self.limits.decode_max}]",
                highlight=False,
            )
            with contextlib.suppress(KeyboardInterrupt):
                began = time.monotonic()
                self.step()  # the first scrape: the baseline of the first interval
                while True:
                    self._wait(began + self.interval_s)
                    began = time.monotonic()
                    try:
                        self.step()
                    except DeployError as exc:
                        self.console.print(f"  scrape failed: {exc}", style="yellow", markup=False)
                    if self.options.once:
                        break
        return 0

    def _wait(self, until: float) -> None:
        """Sleep until `until` (monotonic), or less: every `TICK_S` the router's counters of
        arriving requests are read, and a shift of the workload (`shifted`) ends the interval
        there (a step at the shift, not up to an interval later)."""
        while (left := until - time.monotonic()) > 0:
            if self.options.once:  # one decision from two scrapes an interval apart
                time.sleep(left)
                return
            time.sleep(min(TICK_S, left))
            if time.monotonic() >= until:
                return
            try:
                router = asyncio.run(self._router_metrics())
            except (DeployError, PdkitError):
                continue
            self.early = self.shifted(router)
            if self.early is not None:
                return

    async def _router_metrics(self) -> MetricSet | None:
        target = targets_from_plan(self.plan).router
        async with Prober(timeout=2.0) as prober:
            return _parsed(await prober.get(target.metrics_url, auth_headers(target)))

    def shifted(self, router: MetricSet | None) -> str | None:
        """Why the interval under way should end now (`arrival_shift` since the last
        scrape), or None."""
        if self.previous is None or self.predicted is None:
            return None
        return arrival_shift(
            self.previous.router, router, self.predicted.input_tokens, self.limits.min_requests
        )

    @contextlib.contextmanager
    def _metrics_server(self) -> Iterator[None]:
        if not self.options.metrics_port:
            yield
            return
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = records.metrics_text(owner.last).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.options.metrics_port), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()


def _parsed(answer: Fetched) -> MetricSet | None:
    """The metrics of a /metrics answer; None when it did not answer or is not Prometheus."""
    if not answer.ok:
        return None
    try:
        return parse_metrics(answer.body)
    except PdkitError:
        return None


def run(topology_file: Path, options: LoopOptions, console: Console) -> int:
    return Autoscaler(topology_file, options, console).run()
