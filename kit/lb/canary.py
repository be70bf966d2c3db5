"""The token canary: every prefill x decode pair's tokens, compared at an interval.

KV that arrives altered (a page layout, a NIC, a PCIe path gone bad hours after start) decodes
into fluent, wrong tokens with status 200: SGLang checks no KV by default, and the deploy gate
checked the pairs only once. The canary keeps checking, the way the gate does:

1. Every `--canary-interval` s (0: off; the first round one interval after start), one round:
   one greedy request (`CHECK_TOKENS` tokens, temperature 0, EOS ignored) to each pair of the
   workers that are routable or that the canary took out, `CONCURRENCY` pairs at once, sent
   straight to the workers on the router's client session: never through the router's
   handler, so never in the access log, the request metrics or the users' goodput (the
   workers log it with the request id `pdkit-canary-...`).
2. The tokens are compared as the gate compares them (`kit.token_check`): the majority's are
   expected; with no majority (two pairs, or a tie), the answer every pair last gave together.
3. A worker every one of whose pairs is wrong while other pairs are right is taken out
   (`WorkerPool.quarantine`): its prefill or its decode, whichever the majority blames. Its
   health probes do not readmit it; a round that finds its pairs right again does.
4. A wrong pair whose workers are each right with others is avoided: the dispatcher gives that
   prefill another decode (`avoid`) while one is routable.
5. What a round found is in /metrics (`families`): each pair's state (ok, wrong, failed), the
   rounds, the wrong answers per pair; a worker taken out shows as out with reason `canary`.

A pair that does not answer is `failed` here and nothing more: failed requests and health
probes already take a worker out (`kit.lb.workers`); the canary judges only tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kit.lb.protocol import parse_request
from kit.lb.workers import Worker, WorkerPool
from kit.token_check import CHECK_TOKENS, Answer, Expected, answer_from, disagreements, expected
from kit.token_check import suspects as blamed

log = logging.getLogger("kit.lb.canary")

CONCURRENCY = 8
"""Pairs checked at once: a round over many pairs must not load the workers in a burst."""
TIMEOUT_S = 30.0
"""The longest one pair's request may take (both legs)."""
PROMPT = "pdkit canary: " + " ".join(f"c{i % 10}" for i in range(32))
"""The same plain words for every pair (their tokens are compared); about 45 tokens."""

PairState = Literal["ok", "wrong", "failed"]
PairKey = tuple[str, str]
"""(prefill URL, decode URL)."""


def pair_name(pair: PairKey) -> str:
    return f"{pair[0]} x {pair[1]}"


@dataclass(frozen=True)
class Verdict:
    """What one round found: each pair's state and why (`symptoms`), the workers to take out
    (`culprits`, URL -> why) and the wrong pairs no single worker explains (`avoid`)."""

    states: dict[PairKey, PairState]
    symptoms: dict[PairKey, str]
    culprits: dict[str, str]
    avoid: frozenset[PairKey]
    want: Expected
    unanimous: Answer | None


def judge(
    answers: dict[PairKey, Answer], failures: dict[PairKey, str], baseline: Answer | None
) -> Verdict:
    """The verdict on one round's answers (pure). `baseline` is the answer every pair last gave
    together: expected when the pairs have no majority."""
    named = {pair_name(p): a for p, a in answers.items()}
    want = expected(named, None)
    if want.answer is None and baseline is not None:
        want = expected(named, baseline, "the answer every pair gave before")
    bad = disagreements(named, want)
    states: dict[PairKey, PairState] = {p: "failed" for p in failures}
    symptoms = dict(failures)
    for pair in answers:
        symptom = bad.get(pair_name(pair))
        states[pair] = "wrong" if symptom else "ok"
        if symptom:
            symptoms[pair] = symptom
    wrong = {pair_name(p) for p, s in states.items() if s == "wrong"}
    judged = {pair_name(p): p for p in answers}
    culprits: dict[str, str] = {}
    if wrong:
        for url in blamed(wrong, judged):
            example = next(p for p in judged.values() if url in p and states[p] == "wrong")
            culprits[url] = (
                f"token canary: every pair with it gives other tokens than {want.source}; "
                f"{pair_name(example)} {symptoms[example]}"
            )
    # With nothing to go by (no majority, no earlier agreement) no pair is avoided.
    avoid = frozenset(
        p
        for p, s in states.items()
        if s == "wrong" and want.answer is not None and not set(p) & culprits.keys()
    )
    keys = {a.key for a in answers.values()}
    unanimous = next(iter(answers.values())) if len(keys) == 1 and not failures else None
    return Verdict(states, symptoms, culprits, avoid, want, unanimous)


@dataclass
class PairRecord:
    """A pair's last state, and how many rounds found it wrong."""

    state: PairState = "ok"
    symptom: str = ""
    wrong_rounds: int = 0


@dataclass
class Canary:
    """The canary of one load balancer: `start()` runs its rounds, `close()` stops them.

    `avoid` (prefill URL -> decode URLs) is read by the dispatcher on every request."""

    pool: WorkerPool
    session: aiohttp.ClientSession
    interval: float
    rng: random.Random
    headers: dict[str, str] = field(default_factory=dict)
    avoid: dict[str, frozenset[str]] = field(default_factory=dict)
    pairs: dict[PairKey, PairRecord] = field(default_factory=dict)
    rounds: int = 0
    round_seconds: float = 0.0
    baseline: Answer | None = None
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Exception:  # a bug here must not stop the canary for good
                log.exception("token canary round failed")

    def _candidates(self, role: Literal["prefill", "decode"]) -> list[Worker]:
        return [w for w in self.pool.role(role) if w.routable or w.reason_kind == "canary"]

    async def round(self) -> Verdict:
        """Check every pair once, apply the verdict (take out, release, avoid) and return it."""
        started = time.monotonic()
        pairs = [(p, d) for p in self._candidates("prefill") for d in self._candidates("decode")]
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(prefill: Worker, decode: Worker) -> tuple[PairKey, Answer | str]:
            async with limit:
                return (prefill.url, decode.url), await self._check(prefill, decode)

        results = await asyncio.gather(*(one(p, d) for p, d in pairs))
        answers = {k: r for k, r in results if isinstance(r, Answer)}
        failures = {k: r for k, r in results if isinstance(r, str)}
        verdict = judge(answers, failures, self.baseline)
        self._apply(verdict)
        self.rounds += 1
        self.round_seconds = time.monotonic() - started
        return verdict

    async def _check(self, prefill: Worker, decode: Worker) -> Answer | str:
        """One pair's answer, or why there is none."""
        body = {
            "text": PROMPT,
            "sampling_params": {
                "max_new_tokens": CHECK_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
            "rid": f"pdkit-canary-{self.rng.getrandbits(48):012x}",
        }
        pd = parse_request("/generate", json.dumps(body).encode())
        data, _ = pd.encode(prefill.bootstrap_host, prefill.bootstrap_port, self.rng)
        headers = {"Content-Type": "application/json", **self.headers}
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)

        async def leg(worker: Worker) -> tuple[int, bytes]:
            async with self.session.post(
                worker.url + "/generate", data=data, headers=headers, timeout=timeout
            ) as resp:
                return resp.status, await resp.read()

        try:
            (p_status, p_body), (d_status, d_body) = await asyncio.gather(leg(prefill), leg(decode))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"no answer: {exc!r}"
        for role, status, raw in (("prefill", p_status, p_body), ("decode", d_status, d_body)):
            if status != 200:
                return f"the {role} answered {status}: {raw[:200].decode('utf-8', 'replace')}"
        try:
            answer = answer_from(json.loads(d_body))
        except ValueError:
            answer = None
        return answer if answer is not None else "the decode's answer has no text"

    def _apply(self, verdict: Verdict) -> None:
        now = time.monotonic()
        if verdict.unanimous is not None:
            self.baseline = verdict.unanimous
        for pair in list(self.pairs):
            if pair not in verdict.states:
                del self.pairs[pair]
        for pair, state in verdict.states.items():
            record = self.pairs.setdefault(pair, PairRecord())
            record.state, record.symptom = state, verdict.symptoms.get(pair, "")
            if state == "wrong":
                record.wrong_rounds += 1
        for url, why in verdict.culprits.items():
            worker = self.pool.get(url)
            if worker is not None and worker.routable:
                log.warning("%s worker %s is out: %s", worker.role, url, why)
                self.pool.quarantine(worker, why, now)
        for worker in self.pool:
            if worker.reason_kind != "canary" or worker.url in verdict.culprits:
                continue
            mine = [s for p, s in verdict.states.items() if worker.url in p]
            if mine and all(s == "ok" for s in mine):
                log.info("token canary: %s gives the expected tokens again", worker.url)
                self.pool.release(worker, now)
        avoid: dict[str, set[str]] = {}
        for prefill, decode in verdict.avoid:
            avoid.setdefault(prefill, set()).add(decode)
        self.avoid.clear()
        self.avoid.update({p: frozenset(d) for p, d in avoid.items()})

    def families(self) -> Iterator[Metric]:
        """The canary's metric families (kit.lb.metrics)."""
        state = GaugeMetricFamily(
            "pdkit_lb_canary_pair",
            "1 for each prefill x decode pair's state in the last canary round "
            "(ok, wrong: other tokens than the majority, failed: no answer)",
            labels=["prefill", "decode", "state"],
        )
        wrong = CounterMetricFamily(
            "pdkit_lb_canary_wrong",
            "Canary rounds in which a pair gave wrong tokens",
            labels=["prefill", "decode"],
        )
        for (prefill, decode), record in sorted(self.pairs.items()):
            state.add_metric([prefill, decode, record.state], 1.0)
            wrong.add_metric([prefill, decode], record.wrong_rounds)
        yield state
        yield wrong
        yield CounterMetricFamily("pdkit_lb_canary_rounds", "Canary rounds run", value=self.rounds)
        yield GaugeMetricFamily(
            "pdkit_lb_canary_round_seconds",
            "How long the last canary round took (s)",
            value=self.round_seconds,
        )
