"""`pdkit doctor` and `pdkit up`'s last gate: one real PD request per prefill x decode pair.

SGLang's warm-up and `/health` use a fake bootstrap host and move no KV, so a wrong GID, a NIC
that cannot reach the peer's rail or a firewalled Mooncake port only shows on the first real
request. Here every pair gets its own: the same `/generate` body (a fixed prompt, greedy,
`CHECK_TOKENS` output tokens with `ignore_eos`; its own bootstrap room and request id) goes
straight to the prefill and the decode, as pdkit's router would send it, with no router policy
in the way: the pair is chosen by the URLs the legs go to and the prefill's bootstrap address
in the body, nothing else.

- Tokens, not only KV: a pair can move KV and still answer wrong (KV laid out or delivered
  wrong decodes into fluent garbage, silently, unless SGLang's KV checksum is on). Every pair
  gets the same request, so every pair must give the same tokens, and the colocated reference
  server's (`DoctorOptions.reference_url`) when one is given (`kit.observe.doctor_tokens`).

- Every DP rank of both instances is probed: a pair sends max(prefill dp, decode dp) requests,
  room `r` with `r % prefill_dp` = the prefill's rank (SGLang's follow_bootstrap_room) and the
  decode's rank in `routed_dp_rank` (decode leg only). The TP and PP ranks of a request all move
  their share of its KV, so every node of a multi-node instance takes part.
- Bounded: each pair has `timeout_s`; at most `parallel` pairs run on a worker at a time (1:
  each pair's transfer figures are its own); a worker that does not answer `/health` is not
  probed (its pairs fail at once), and one whose pairs timed out `give_up_after` times has its
  other pairs skipped. A 16 x 16 matrix of healthy sim workers takes a few seconds.
- Figures: TTFT is the prefill's answer time (its first token computed and its KV sent; the
  decode's first token follows it at once), the answer time the decode's; the KV transfer
  time and speed are what the prefill itself reports (`sglang:kv_transfer_latency_ms` and
  `sglang:kv_transfer_speed_gb_s`, scraped before and after the pair, on SGLang and the sim).
- Causes: `explain` reads both instances' log tails (every node) through the caller's reader and
  matches `kit.observe.signatures`; unknown failures keep the lines that matter.

Pure apart from the HTTP calls; the caller (kit.deploy) supplies the log reader.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kit.errors import PdkitError, ProbeError
from kit.net import url_host
from kit.observe.doctor_tokens import (
    CHECK_TOKENS,
    Answer,
    Expected,
    answer_of,
    disagreements,
    expected,
    first_difference,
    suspects,
)
from kit.observe.probe import Fetched, Prober
from kit.observe.prom import parse_metrics
from kit.observe.signatures import Match, diagnose, notable
from kit.topology.plan_types import Plan, Role, WorkerProcess

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_PARALLEL = 1
GIVE_UP_AFTER = 2
HEALTH_TIMEOUT_S = 5.0
PROMPT_WORDS = 96  # about 130 tokens with real tokenizers and with the sim's rule
DECODE_GRACE_S = 2.0  # after a failed prefill, how long the decode may still explain itself
LOG_LINES = 200
KV_FAMILIES = ("sglang:kv_transfer_latency_ms", "sglang:kv_transfer_speed_gb_s")

PairState = Literal["ok", "failed", "timeout", "skipped", "wrong"]


@dataclass(frozen=True)
class Instance:
    """One prefill or decode instance as the doctor reaches it: rank 0's URL, its bootstrap
    address (prefill), its DP ranks, every process of it (one per node) for log tails, and the
    /health URL of each other node (`nodes`: (process, URL); SGLang's ranks >= 1 serve it)."""

    name: str
    role: Role
    url: str
    address: str
    bootstrap_port: int | None
    dp: int
    processes: tuple[str, ...]
    nodes: tuple[tuple[str, str], ...] = ()


def instances(plan: Plan, role: Role) -> tuple[Instance, ...]:
    """The instances of `role`, in Plan order."""
    out = []
    for rank0 in plan.role(role):
        mine = [w for w in plan.workers if w.instance_name == rank0.instance_name]
        nodes = tuple((w.name, w.url) for w in mine if not w.serves_http)
        out.append(_instance(rank0, tuple(w.name for w in mine), nodes))
    return tuple(out)


def _instance(
    w: WorkerProcess, processes: tuple[str, ...], nodes: tuple[tuple[str, str], ...] = ()
) -> Instance:
    return Instance(
        name=w.instance_name,
        role=w.role,
        url=w.url,
        address=w.address,
        bootstrap_port=w.bootstrap_port,
        dp=max(1, w.parallelism.dp),
        processes=processes,
        nodes=nodes,
    )


@dataclass(frozen=True)
class DoctorOptions:
    """`timeout_s` per pair; `parallel` pairs at most in flight per worker; a worker's other
    pairs are skipped after `give_up_after` of its pairs timed out."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    parallel: int = DEFAULT_PARALLEL
    give_up_after: int = GIVE_UP_AFTER
    health_timeout_s: float = HEALTH_TIMEOUT_S
    reference_url: str | None = None
    """A colocated server of the same model (`--disaggregation-mode null`): every pair's tokens
    must equal its answer to the same request. None: the pairs must agree with each other."""
    expected: Answer | None = None
    """Without `reference_url`: the answer every pair must give, known beforehand (`pdkit
    upgrade`: the deployment's own before it started), named `expected_source` in messages."""
    expected_source: str = "the expected answer"

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ProbeError(f"--timeout must be > 0 s, got {self.timeout_s:g}")
        if self.parallel < 1:
            raise ProbeError(f"--parallel must be >= 1, got {self.parallel}")


@dataclass(frozen=True)
class Transfer:
    """What the prefill reported for the pair's KV transfers: mean latency (ms) and speed
    (GB/s, SGLang's figure), over `count` transfers (one per rank and request)."""

    latency_ms: float
    speed_gb_s: float
    count: int


@dataclass(frozen=True)
class PairResult:
    """One prefill x decode pair: `state`, TTFT (the prefill's answer) and the decode's
    answer time in ms, the prefill's transfer figures, the tokens the decode gave (`answer`),
    and for a failure what was seen (`symptom`; for `wrong`, the tokens against the expected
    ones), the error texts the workers answered, the causes found in their logs and, without
    a known cause, the lines that matter."""

    prefill: str
    decode: str
    state: PairState
    rooms: tuple[int, ...] = ()
    rids: tuple[str, ...] = ()
    ttft_ms: float | None = None
    answer_ms: float | None = None
    transfer: Transfer | None = None
    answer: Answer | None = None
    symptom: str = ""
    messages: tuple[str, ...] = ()
    causes: tuple[Match, ...] = ()
    evidence: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.prefill} x {self.decode}"

    @property
    def ok(self) -> bool:
        return self.state == "ok"


@dataclass(frozen=True)
class Matrix:
    """Every pair of a deployment, prefills in rows and decodes in columns; `expected` is the
    token check's expected answer and its source, `reference_error` why the reference server
    gave none (which fails the check)."""

    deployment: str
    prefills: tuple[Instance, ...]
    decodes: tuple[Instance, ...]
    pairs: tuple[PairResult, ...]
    seconds: float
    timeout_s: float
    expected: Expected | None = None
    reference_url: str | None = None
    reference_error: str = ""

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.pairs) and not self.reference_error

    @property
    def failed(self) -> tuple[PairResult, ...]:
        return tuple(p for p in self.pairs if not p.ok)

    def pair(self, prefill: str, decode: str) -> PairResult:
        for p in self.pairs:
            if (p.prefill, p.decode) == (prefill, decode):
                return p
        raise KeyError((prefill, decode))


# -- one pair -----------------------------------------------------------------------------


def prompt() -> str:
    """The doctor's prompt: plain words, the same for every pair (their tokens are compared);
    the pair is in the request id, which SGLang logs."""
    words = " ".join(f"kv{i % 10}" for i in range(PROMPT_WORDS))
    return f"pdkit doctor: {words}"


def check_request(text: str, rid: str | None = None) -> dict[str, Any]:
    """The greedy, fixed request every pair (and the reference) answers: temperature 0, a fixed
    number of tokens whatever the model's EOS."""
    body: dict[str, Any] = {
        "text": text,
        "sampling_params": {
            "max_new_tokens": CHECK_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
    }
    if rid is not None:
        body["rid"] = rid
    return body


def request_body(
    prefill: Instance, text: str, room: int, rid: str, decode_rank: int | None = None
) -> bytes:
    """A /generate body with the PD bootstrap fields (docs/lb.md); `decode_rank` adds
    `routed_dp_rank`, which only the decode leg gets."""
    body = check_request(text, rid) | {
        "bootstrap_host": url_host(prefill.address),
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }
    if decode_rank is not None:
        body["routed_dp_rank"] = decode_rank
    return json.dumps(body, separators=(",", ":")).encode()


def rooms_for(prefill_dp: int, decode_dp: int, salt: int) -> list[tuple[int, int | None]]:
    """(bootstrap room, decode DP rank or None) per request: one per DP rank of the larger
    side; room % prefill_dp walks every prefill rank."""
    count = max(prefill_dp, decode_dp)
    # Random, not the clock: probes started in the same millisecond (the gates of one
    # autoscale move, run at once against the same prefill) took the same room, and SGLang
    # refuses a duplicate room on both sides.
    base = (secrets.randbits(40) + salt * 7919) % (2**40) * prefill_dp
    return [(base + i % prefill_dp, i % decode_dp if decode_dp > 1 else None) for i in range(count)]


def error_text(answer: Fetched) -> str:
    """What a worker said when it failed: SGLang's error message, else the body or failure."""
    if answer.status is None:
        return answer.detail or "no answer"
    data = answer.json(any_status=True)
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
        meta = data.get("meta_info")
        if isinstance(meta, dict) and isinstance(meta.get("finish_reason"), dict):
            return str(meta["finish_reason"].get("message") or meta["finish_reason"])
    return answer.body.strip()[:500] or f"HTTP {answer.status}"


_REQUEST_IDS = re.compile(r"(decode_req\.)?req\.(rid|bootstrap_room)=\S+ ?")


def shorten(text: str, limit: int = 160) -> str:
    """One line of at most `limit` characters (the rest elided)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def gist(message: str) -> str:
    """A worker's error without the request's id and room (the pair already names them)."""
    return shorten(_REQUEST_IDS.sub("", message), 200)


def answered_ok(answer: Fetched) -> bool:
    """A decode answer that carries a generated token (an abort can come with status 200)."""
    data = answer.json()
    if not isinstance(data, dict):
        return False
    meta = data.get("meta_info")
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    return not (isinstance(finish, dict) and finish.get("type") == "abort")


@dataclass
class _Leg:
    prefill: Fetched | None = None
    decode: Fetched | None = None


async def _one_request(
    prober: Prober, prefill: Instance, decode: Instance, send: tuple[bytes, bytes], timeout: float
) -> _Leg:
    """Both legs of one request, concurrently. A prefill that fails leaves the decode
    `DECODE_GRACE_S` to answer (its message tends to say more), then calls it off; a decode
    that fails calls the prefill off (it would wait for a decode that never comes)."""
    prefill_task = asyncio.ensure_future(
        prober.post(f"{prefill.url}/generate", send[0], timeout=timeout)
    )
    decode_task = asyncio.ensure_future(
        prober.post(f"{decode.url}/generate", send[1], timeout=timeout)
    )
    leg = _Leg()
    pending: set[asyncio.Future[Fetched]] = {prefill_task, decode_task}
    deadline = time.monotonic() + timeout
    while pending:
        done, pending = await asyncio.wait(
            pending, timeout=max(0.0, deadline - time.monotonic()), return_when="FIRST_COMPLETED"
        )
        if not done:
            break
        if prefill_task in done:
            leg.prefill = prefill_task.result()
            if not leg.prefill.ok and decode_task in pending:
                deadline = min(deadline, time.monotonic() + DECODE_GRACE_S)
        if decode_task in done:
            leg.decode = decode_task.result()
            if not (leg.decode.ok and answered_ok(leg.decode)):
                break
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return leg


def _transfer(before: Fetched | None, after: Fetched | None) -> Transfer | None:
    """The prefill's KV transfer figures between two scrapes of its /metrics."""
    if before is None or after is None or not (before.ok and after.ok):
        return None
    try:
        old, new = parse_metrics(before.body, KV_FAMILIES), parse_metrics(after.body, KV_FAMILIES)
    except ProbeError:
        return None
    latency_now, speed_now = (new.histogram(f) for f in KV_FAMILIES)
    if latency_now is None or speed_now is None:
        return None
    latency = latency_now.since(old.histogram(KV_FAMILIES[0]))
    speed = speed_now.since(old.histogram(KV_FAMILIES[1]))
    if latency.count <= 0 or speed.count <= 0:
        return None
    return Transfer(latency.sum / latency.count, speed.sum / speed.count, int(latency.count))


async def probe_pair(
    prober: Prober, prefill: Instance, decode: Instance, timeout: float, salt: int = 0
) -> PairResult:
    """One pair: a request per DP rank (see the module doc), timed, with the prefill's own
    transfer figures; never raises for a worker's failure (it is the result)."""
    text = prompt()
    plan = rooms_for(prefill.dp, decode.dp, salt)
    rids = tuple(f"pdkit-doctor-{prefill.name}-{decode.name}-{room}" for room, _ in plan)
    before = await prober.get(f"{prefill.url}/metrics")
    legs = await asyncio.gather(
        *(
            _one_request(
                prober,
                prefill,
                decode,
                (
                    request_body(prefill, text, room, rid),
                    request_body(prefill, text, room, rid, rank),
                ),
                timeout,
            )
            for (room, rank), rid in zip(plan, rids, strict=True)
        )
    )
    base = PairResult(prefill.name, decode.name, "ok", tuple(r for r, _ in plan), rids)
    failures = [_failure(prefill, decode, leg, timeout) for leg in legs]
    bad = [f for f in failures if f is not None]
    if bad:
        state: PairState = "timeout" if all(s == "timeout" for s, _, _ in bad) else "failed"
        messages = tuple(dict.fromkeys(m for _, _, ms in bad for m in ms))
        return replace(base, state=state, symptom=bad[0][1], messages=messages)
    after = await prober.get(f"{prefill.url}/metrics")
    ttft = max(leg.prefill.seconds for leg in legs if leg.prefill is not None) * 1000
    answered = max(leg.decode.seconds for leg in legs if leg.decode is not None) * 1000
    result = replace(base, ttft_ms=ttft, answer_ms=answered, transfer=_transfer(before, after))
    answers = [answer_of(leg.decode) for leg in legs]
    first = answers[0]
    if first is None:
        return result
    for index, other in enumerate(answers[1:], start=1):
        if other is None or other.key != first.key:  # one DP rank of the pair answers wrong
            where = first_difference(other, first) if other is not None else "(no answer)"
            return replace(
                result,
                state="wrong",
                answer=first,
                symptom=(
                    f"its requests gave different tokens (room {plan[index][0]} "
                    f"{where}): {other.show() if other else 'none'} against {first.show()}"
                ),
            )
    return replace(result, answer=first)


def _failure(
    prefill: Instance, decode: Instance, leg: _Leg, timeout: float
) -> tuple[PairState, str, tuple[str, ...]] | None:
    """None when both legs succeeded, else (state, symptom, the workers' error texts): a
    timeout when no leg failed but one never answered, a failure otherwise."""
    if all(a is not None and a.ok and answered_ok(a) for a in (leg.decode, leg.prefill)):
        return None
    messages: list[str] = []
    parts: list[str] = []
    failed = False
    for instance, answer in ((decode, leg.decode), (prefill, leg.prefill)):
        if answer is None:
            parts.append(f"{instance.name} gave no answer within {timeout:g} s")
        elif answer.status is None:
            parts.append(f"{instance.name}: {answer.detail or 'no answer'}")
            failed = failed or answer.failure != "timeout"
        elif not (answer.ok and answered_ok(answer)):
            text = error_text(answer)
            said = f"{instance.name} answered HTTP {answer.status}"
            same = messages and _cause(messages[0]) == _cause(text)
            parts.append(f"{said} with the same exception" if same else f"{said}: {gist(text)}")
            messages.append(text)
            failed = True
    return ("failed" if failed else "timeout"), "; ".join(parts), tuple(messages)


def _cause(message: str) -> str:
    """What SGLang's "... failed for request ... with exception X" says after "exception"."""
    return message.rpartition(" with exception ")[2]


# -- the matrix ---------------------------------------------------------------------------


def _order(prefills: Sequence[Instance], decodes: Sequence[Instance]) -> list[tuple[int, int]]:
    """Pairs in rounds where each worker appears about once (i, i+r mod D): with one pair in
    flight per worker, every round runs in parallel."""
    count = len(decodes)
    return sorted(
        ((i, j) for i in range(len(prefills)) for j in range(count)),
        key=lambda ij: ((ij[1] - ij[0]) % count, ij[0]),
    )


async def _health(prober: Prober, targets: Sequence[Instance], timeout: float) -> dict[str, str]:
    """Why each worker that is not healthy is not: {name: what is wrong} (healthy ones absent).
    Every node of an instance is asked: a multi-node instance is sick when any node is."""

    async def one(instance: Instance, process: str, url: str) -> tuple[str, str, Fetched]:
        return instance.name, process, await prober.get(f"{url}/health", timeout=timeout)

    asked = [(t, t.name, t.url) for t in targets] + [
        (t, process, url) for t in targets for process, url in t.nodes
    ]
    answers = await asyncio.gather(*(one(*a) for a in asked))
    down: dict[str, str] = {}
    for name, process, a in answers:
        if a.ok or name in down:
            continue
        why = f"HTTP {a.status}" if a.status is not None else a.detail or "no answer"
        who = name if process == name else f"{name}'s node {process}"
        down[name] = f"{who} does not answer /health ({why})"
    return down


async def run_matrix(plan: Plan, options: DoctorOptions) -> Matrix:
    """Probe every prefill x decode pair of `plan` (see the module doc)."""
    prefills, decodes = instances(plan, "prefill"), instances(plan, "decode")
    started = time.monotonic()
    results: dict[tuple[int, int], PairResult] = {}
    async with Prober(options.timeout_s, concurrency=1024) as prober:
        health_s = min(options.health_timeout_s, options.timeout_s)
        down = await _health(prober, (*prefills, *decodes), health_s)
        for i, p in enumerate(prefills):
            for j, d in enumerate(decodes):
                sick = [w for w in (p, d) if w.name in down]
                if sick:
                    symptom = "; ".join(f"{down[w.name]}: not probed" for w in sick)
                    results[i, j] = PairResult(p.name, d.name, "failed", symptom=symptom)
        pending = [ij for ij in _order(prefills, decodes) if ij not in results]
        await _schedule(
            prober,
            prefills=prefills,
            decodes=decodes,
            pending=pending,
            results=results,
            options=options,
        )
        reference, reference_error = options.expected, ""
        if options.reference_url:
            reference, reference_error = await _reference(prober, options)
    pairs = tuple(results[i, j] for i in range(len(prefills)) for j in range(len(decodes)))
    matrix = Matrix(
        plan.name,
        prefills,
        decodes,
        pairs,
        time.monotonic() - started,
        options.timeout_s,
        reference_url=options.reference_url,
        reference_error=reference_error,
    )
    source = "the reference" if options.reference_url else options.expected_source
    return judge_tokens(matrix, reference, source)


async def _reference(prober: Prober, options: DoctorOptions) -> tuple[Answer | None, str]:
    """The reference server's answer to the check request, or why there is none."""
    url = (options.reference_url or "").rstrip("/")
    body = json.dumps(check_request(prompt(), "pdkit-doctor-reference")).encode()
    fetched = await prober.post(f"{url}/generate", body, timeout=options.timeout_s)
    answer = answer_of(fetched)
    if answer is not None:
        return answer, ""
    said = error_text(fetched) if fetched.answered else fetched.detail or "no answer"
    return None, (
        f"the reference {url} gave no answer to compare with (HTTP {fetched.status}: "
        f"{gist(said)}). To fix: pass the URL of a colocated server of the same model "
        "(--disaggregation-mode null) that serves /generate"
        if fetched.answered
        else f"the reference {url} gave no answer to compare with ({gist(said)}). To fix: "
        "pass the URL of a running colocated server of the same model"
    )


def judge_tokens(matrix: Matrix, reference: Answer | None, source: str = "the reference") -> Matrix:
    """The matrix with every pair whose tokens differ from the expected ones (the reference's,
    else the majority's) turned `wrong`, named with what it gave against what was expected;
    a worker all of whose pairs are wrong is named as the likely cause."""
    answers = {p.name: p.answer for p in matrix.pairs if p.ok and p.answer is not None}
    want = expected(answers, reference, source)
    bad = disagreements(answers, want)
    already = {p.name for p in matrix.pairs if p.state == "wrong"}
    culprits = suspects(set(bad) | already, {p.name: (p.prefill, p.decode) for p in matrix.pairs})
    pairs = []
    for pair in matrix.pairs:
        if pair.name in bad:
            symptom = bad[pair.name]
            mine = [w for w in culprits if w in (pair.prefill, pair.decode)]
            if mine:
                symptom += f"; every pair with {' and '.join(mine)} gives wrong tokens"
            pairs.append(replace(pair, state="wrong", symptom=symptom))
        else:
            pairs.append(pair)
    return replace(matrix, pairs=tuple(pairs), expected=want)


async def _schedule(
    prober: Prober,
    *,
    prefills: Sequence[Instance],
    decodes: Sequence[Instance],
    pending: list[tuple[int, int]],
    results: dict[tuple[int, int], PairResult],
    options: DoctorOptions,
) -> None:
    """Run `pending` pairs, at most `options.parallel` per worker at a time, in order."""
    busy: dict[str, int] = {}
    timeouts: dict[str, int] = {}
    running: dict[asyncio.Task[PairResult], tuple[int, int]] = {}
    salt = 0
    while pending or running:
        for ij in list(pending):
            p, d = prefills[ij[0]], decodes[ij[1]]
            given_up = [w for w in (p, d) if timeouts.get(w.name, 0) >= options.give_up_after]
            if given_up:
                w = given_up[0]
                results[ij] = PairResult(
                    p.name,
                    d.name,
                    "skipped",
                    symptom=f"not probed: {timeouts[w.name]} pairs with {w.name} timed out",
                )
                pending.remove(ij)
                continue
            if all(busy.get(w.name, 0) < options.parallel for w in (p, d)):
                salt += 1
                task = asyncio.ensure_future(probe_pair(prober, p, d, options.timeout_s, salt))
                running[task] = ij
                for w in (p, d):
                    busy[w.name] = busy.get(w.name, 0) + 1
                pending.remove(ij)
        if not running:
            continue
        done, _ = await asyncio.wait(running, return_when="FIRST_COMPLETED")
        for task in done:
            ij = running.pop(task)
            result = task.result()
            results[ij] = result
            for name in (result.prefill, result.decode):
                busy[name] -= 1
                if result.state == "timeout":
                    timeouts[name] = timeouts.get(name, 0) + 1


# -- causes -------------------------------------------------------------------------------

LogReader = Callable[[str], list[str]]
"""process name -> the last lines of its log (raises `PdkitError` when it cannot be read)."""


@dataclass
class _Logs:
    read: LogReader
    cache: dict[str, list[str] | str] = field(default_factory=dict)

    def lines(self, process: str) -> list[str] | str:
        """The tail, or why it could not be read."""
        if process not in self.cache:
            try:
                self.cache[process] = self.read(process)
            except PdkitError as exc:  # a log we cannot read must not hide the matrix
                self.cache[process] = f"{process}'s log could not be read: {exc}"
        return self.cache[process]


def explain(matrix: Matrix, read: LogReader) -> Matrix:
    """The matrix with causes for every failed pair: the workers' error texts and both
    instances' log tails (every node) matched against the signature table."""
    logs = _Logs(read)
    by_name = {i.name: i for i in (*matrix.prefills, *matrix.decodes)}
    pairs = []
    for pair in matrix.pairs:
        if pair.ok or pair.state == "skipped":
            pairs.append(pair)
            continue
        seen: list[tuple[str, str]] = [(f"{pair.name} answer", m) for m in pair.messages]
        unread: list[str] = []
        for instance in (by_name[pair.prefill], by_name[pair.decode]):
            for process in instance.processes:
                tail = logs.lines(process)
                if isinstance(tail, str):
                    unread.append(tail)
                else:
                    seen += [(process, line) for line in tail]
        causes = tuple(diagnose(seen))
        evidence: tuple[str, ...] = ()
        if not causes:
            about = [f"{w}: {line}" for w, line in seen if any(r in line for r in pair.rids)]
            evidence = tuple(notable(about) or notable(f"{w}: {line}" for w, line in seen))
        pairs.append(replace(pair, causes=causes, evidence=(*evidence, *unread)))
    return replace(matrix, pairs=tuple(pairs))
