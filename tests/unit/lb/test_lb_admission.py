"""SLO-aware admission: the models and the decision as pure functions, then through a real load
balancer: 429s at once with Retry-After in OpenAI's error shape, counted in /metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from kit.lb.admission import (
    MIN_SAMPLES,
    Admission,
    AdmissionConfig,
    DecodeModel,
    PrefillModel,
    Rejection,
    Ticket,
    prompt_tokens,
)
from kit.lb.config import WorkerSpec
from kit.lb.workers import Worker
from tests.support.lb_cluster import run, running_cluster


def worker(url: str, role: str = "prefill") -> Worker:
    return Worker(WorkerSpec(url, role))  # type: ignore[arg-type]


def serve(model: PrefillModel, tokens: float, seconds: float, count: int, t: float) -> float:
    """`count` legs of `tokens`, one after the other, `seconds` each, from time `t`."""
    for _ in range(count):
        model.started(tokens, t)
        t += seconds
        model.ended(tokens, t, served=True)
    return t


def learned(admission: Admission, prefill: Worker, tokens_per_s: float) -> float:
    """Teach `prefill`'s model a service rate; returns the model's clock."""
    model = admission.prefill_model(prefill)
    start = time.monotonic()
    return serve(model, tokens_per_s * 0.1, 0.1, MIN_SAMPLES, start)


def test_a_prefill_model_measures_tokens_per_busy_second_at_low_and_high_load():
    model = PrefillModel()
    t = serve(model, 500, 0.25, MIN_SAMPLES, time.monotonic())  # one at a time: 2000 tok/s
    assert model.rate() == pytest.approx(2000, rel=0.03)
    model.started(500, t)  # four at once, all done after 0.5 s: the batch ran at 4000 tok/s
    model.started(500, t)
    model.started(500, t)
    model.started(500, t)
    assert model.queued == 2000
    for _ in range(4):
        model.ended(500, t + 0.5, served=True)
    assert 2000 < (model.rate() or 0) < 4000  # the window still remembers the slower past
    assert model.queued == 0


def test_a_model_that_has_not_learned_admits():
    admission = Admission(AdmissionConfig(ttft=0.4, tpot=0.04))
    prefill, decode = worker("http://p"), worker("http://d", "decode")
    admission.prefill_model(prefill).started(1e9, time.monotonic())  # a huge queue, no rate yet
    verdict = admission.decide(prefill, [prefill], decode, 500, "normal")
    assert isinstance(verdict, Ticket) and verdict.ttft is None


def test_a_request_predicted_to_miss_the_ttft_is_rejected_with_a_retry_time():
    admission = Admission(AdmissionConfig(ttft=1.0, tpot=0.1, margin=0.2))
    prefill, decode = worker("http://p"), worker("http://d", "decode")
    t = learned(admission, prefill, 1000)  # 1000 prompt tokens per second
    model = admission.prefill_model(prefill)
    model.started(600, t)  # 0.6 s of work ahead
    fits = admission.decide(prefill, [prefill], decode, 100, "normal")
    assert isinstance(fits, Ticket) and fits.ttft == pytest.approx(0.7, rel=0.03)
    model.started(900, t)  # now 1.5 s ahead: 1.6 s predicted against 0.8 s for normal
    miss = admission.decide(prefill, [prefill], decode, 100, "normal")
    assert isinstance(miss, Rejection) and miss.reason == "ttft"
    assert miss.predicted == pytest.approx(1.6, rel=0.03) and miss.limit == pytest.approx(0.8)
    assert miss.retry_after == 1
    assert "time to first token 1.6 s" in miss.message("normal")


def test_the_lowest_priority_is_shed_first_and_the_highest_last():
    admission = Admission(AdmissionConfig(ttft=1.0, tpot=0.1, margin=0.2))
    prefill, decode = worker("http://p"), worker("http://d", "decode")
    t = learned(admission, prefill, 1000)
    admission.prefill_model(prefill).started(600, t)  # 0.7 s predicted with 100 own tokens
    verdicts = {p: admission.decide(prefill, [prefill], decode, 100, p) for p in ("low", "normal")}
    assert isinstance(verdicts["low"], Rejection)  # low may use 0.6 s
    assert isinstance(verdicts["normal"], Ticket)  # normal 0.8 s
    admission.prefill_model(prefill).started(200, t)  # 0.9 s predicted
    assert isinstance(admission.decide(prefill, [prefill], decode, 100, "normal"), Rejection)
    assert isinstance(admission.decide(prefill, [prefill], decode, 100, "high"), Ticket)


def test_a_request_that_would_miss_on_its_prefill_goes_to_a_shorter_queue():
    admission = Admission(AdmissionConfig(ttft=1.0, tpot=0.1))
    busy, idle, decode = worker("http://p0"), worker("http://p1"), worker("http://d", "decode")
    t = learned(admission, busy, 1000)
    learned(admission, idle, 1000)
    admission.prefill_model(busy).started(5000, t)
    verdict = admission.decide(busy, [busy, idle], decode, 100, "normal")
    assert isinstance(verdict, Ticket) and verdict.prefill is idle


def test_a_decode_step_time_that_grows_with_the_batch_rejects_on_tpot():
    model = DecodeModel()
    now = time.monotonic()
    for i in range(MIN_SAMPLES):
        batch = 10 + 10 * i
        model.observe(batch, 0.010 + 0.0005 * batch, now + i)  # 10 ms + 0.5 ms per request
    assert model.step(200) == pytest.approx(0.110, rel=0.01)
    admission = Admission(AdmissionConfig(ttft=10.0, tpot=0.1, margin=0.2))
    prefill, decode = worker("http://p"), worker("http://d", "decode")
    admission._decodes[decode.url] = model
    decode.inflight = 100  # 60 ms per token at 101: within 80 ms
    assert isinstance(admission.decide(prefill, [prefill], decode, 100, "normal"), Ticket)
    decode.inflight = 150  # 85.5 ms per token
    verdict = admission.decide(prefill, [prefill], decode, 100, "normal")
    assert isinstance(verdict, Rejection) and verdict.reason == "tpot"


def test_prompt_length_is_counted_from_ids_or_estimated_from_text():
    assert prompt_tokens({"input_ids": list(range(300))}, "/generate") == 300
    assert prompt_tokens({"text": "x" * 400}, "/generate") == 100
    assert prompt_tokens({"text": ["x" * 40, "y" * 80]}, "/generate") == 30
    assert prompt_tokens({"prompt": "é" * 10}, "/v1/completions") == 5  # UTF-8 bytes / 4
    chat = {"messages": [{"role": "user", "content": "x" * 384}]}
    assert prompt_tokens(chat, "/v1/chat/completions") == 100


# -- through a running load balancer ----------------------------------------------------------

ADMISSION = ["--admission", "--slo-ttft-ms", "400", "--slo-tpot-ms", "1000"]


def test_an_overloaded_router_answers_429_at_once_with_retry_after():
    async def scenario():
        async with running_cluster(1, 1, args=ADMISSION) as c:
            c.prefill[0].latency = 0.1
            for _ in range(MIN_SAMPLES):  # one at a time: the prefill's pace is learned
                status, _, headers = await c.post("/generate", {"text": "x" * 400})
                assert status == 200
            done_at: dict[int, float] = {}

            async def one(i: int) -> tuple[int, object, object]:
                answer = await c.post("/generate", {"text": "x" * 400})
                done_at[i] = time.monotonic()
                return answer

            answers = await asyncio.gather(*(one(i) for i in range(12)))
            statuses = [status for status, _, _ in answers]
            assert 200 in statuses and 429 in statuses
            rejected = [i for i, (status, _, _) in enumerate(answers) if status == 429]
            admitted = [i for i, (status, _, _) in enumerate(answers) if status == 200]
            # refused at the door: every 429 is back before any admitted request finished
            assert max(done_at[i] for i in rejected) < min(done_at[i] for i in admitted)
            status, body, headers = answers[rejected[0]]
            assert int(headers["Retry-After"]) >= 1 and headers["X-Request-Id"]
            assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == 429
            assert "predicted time to first token" in body["error"]["message"]
            _, metrics, _ = await c.get("/metrics")
            count = f'pdkit_lb_rejected_total{{priority="normal",reason="ttft"}} {len(rejected)}.0'
            assert count.encode() in metrics
            assert b'pdkit_lb_admitted_total{priority="normal"}' in metrics
            assert b"pdkit_lb_admission_ttft_error_ratio_count" in metrics
            assert b"pdkit_lb_admission_prefill_rate_tokens{" in metrics
            assert sum(len(w.requests) for w in c.prefill) == MIN_SAMPLES + len(admitted)

    run(scenario())


def test_a_priority_the_router_does_not_know_is_a_400_naming_the_header():
    async def scenario():
        async with running_cluster(1, 1, args=ADMISSION) as c:
            status, body, _ = await c.post(
                "/generate", {"text": "x"}, headers={"X-PDKit-Priority": "urgent"}
            )
            assert status == 400 and body["error"]["param"] == "X-PDKit-Priority"
            status, _, _ = await c.post(
                "/generate", {"text": "x"}, headers={"X-PDKit-Priority": "LOW"}
            )
            assert status == 200

    run(scenario())
