"""SLO-aware admission: refuse at the door the requests that would miss their SLO anyway.

Past a deployment's goodput rate its queues grow without bound and every request misses the
SLO. Mooncake's answer (early rejection on predicted load) is to answer at once, with 429 and
`Retry-After`, the requests that would miss it, so that the ones admitted still meet it. Each
PD request gets a predicted TTFT and TPOT from what the router knows:

TTFT, per prefill: its queue in prompt tokens, served at the rate it was seen to serve:

    predicted TTFT = (tokens ahead + own tokens) / rate + gap

- tokens ahead: the prompt tokens of this router's requests on that prefill whose prefill leg
  has not ended (its own in-flight accounting), plus what the worker says waits beyond those
  (`/v1/loads` num_waiting_uncached_tokens: other clients' requests), polled by `WorkerLoads`;
- own tokens: input_ids counted, else the prompt's UTF-8 bytes / 4 (the usual rule for BPE
  tokenizers, and the sim's);
- rate: prompt tokens per second of busy time (time with at least one leg in flight), over an
  exponentially decaying window of `WINDOW` s: one request's own speed at low load, the
  prefill's throughput at saturation, whatever the bottleneck behind it (compute, KV room on
  the decode, the transfer);
- gap: the time from a prefill leg's end to the first token at the client (the decode's first
  step), averaged over streams.

TPOT, per decode: the step time against the running batch, `a + c * batch`, fit by decaying
least squares to each finished stream's mean gap between tokens and the decode's batch (own
in-flight streams plus other clients' from `/v1/loads`), evaluated at one more request.

Decision: a request is rejected when a prediction exceeds its class's share of the SLO:
`high` 1, `normal` (default) 1 - margin, `low` 1 - 2 * margin (sent as `X-PDKit-Priority`), so
the lowest class is shed first and the queue settles below the SLO by the margin, which absorbs
the prediction's error. When the chosen prefill would miss, the one with the shortest predicted
TTFT is tried. A model with fewer than `MIN_SAMPLES` observations admits (it is learning).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

from kit.lb.protocol import PdRequest
from kit.lb.workers import Worker

Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
PRIORITY_HEADER = "X-PDKit-Priority"

WINDOW = 10.0  # seconds over which rates and step times are averaged (decay time constant)
MIN_SAMPLES = 8  # observations a model needs before it may reject
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """SLO targets (s) and the safety margin (share of the SLO kept free)."""

    ttft: float
    tpot: float
    margin: float = 0.2

    def budget(self, priority: Priority) -> float:
        """Share of the SLO a prediction may use for this class."""
        if priority == "high":
            return 1.0
        if priority == "low":
            return max(1.0 - 2 * self.margin, 0.05)
        return max(1.0 - self.margin, 0.05)


class PrefillModel:
    """One prefill's queue (prompt tokens in flight) and its measured service rate."""

    __slots__ = (
        "busy",
        "external",
        "inflight",
        "last",
        "queued",
        "samples",
        "tokens",
    )

    def __init__(self) -> None:
        self.queued = 0.0  # prompt tokens of this router's legs in flight
        self.inflight = 0
        self.external = 0.0  # tokens the worker reports waiting beyond ours
        self.tokens = 0.0  # decayed sum of prompt tokens served
        self.busy = 0.0  # decayed busy seconds
        self.last = time.monotonic()
        self.samples = 0

    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt <= 0:
            return
        decay = math.exp(-dt / WINDOW)
        self.tokens *= decay
        self.busy = self.busy * decay + (WINDOW * (1 - decay) if self.inflight else 0.0)
        self.last = now

    def started(self, tokens: float, now: float) -> None:
        self._advance(now)
        self.inflight += 1
        self.queued += tokens

    def ended(self, tokens: float, now: float, served: bool) -> None:
        self._advance(now)
        self.inflight -= 1
        self.queued = max(self.queued - tokens, 0.0)
        if served:
            self.tokens += tokens
            self.samples += 1

    def rate(self) -> float | None:
        """Prompt tokens per busy second, None while learning."""
        if self.samples < MIN_SAMPLES or self.busy <= 0:
            return None
        return self.tokens / self.busy

    def ahead(self) -> float:
        return self.queued + self.external


class DecodeModel:
    """One decode's step time against its batch: decaying least squares of gap = a + c * b."""

    __slots__ = ("external", "last", "samples", "sb", "sbb", "sby", "sw", "sy")

    def __init__(self) -> None:
        self.sw = self.sb = self.sy = self.sbb = self.sby = 0.0
        self.samples = 0
        self.external = 0  # requests the worker runs beyond this router's
        self.last = time.monotonic()

    def observe(self, batch: float, step: float, now: float) -> None:
        decay = math.exp(-max(now - self.last, 0.0) / WINDOW)
        self.last = now
        self.sw = self.sw * decay + 1
        self.sb = self.sb * decay + batch
        self.sy = self.sy * decay + step
        self.sbb = self.sbb * decay + batch * batch
        self.sby = self.sby * decay + batch * step
        self.samples += 1

    def step(self, batch: float) -> float | None:
        """Predicted seconds per token at `batch` requests, None while learning."""
        if self.samples < MIN_SAMPLES or self.sw <= 0:
            return None
        mean_b, mean_y = self.sb / self.sw, self.sy / self.sw
        var_b = self.sbb / self.sw - mean_b * mean_b
        slope = 0.0
        if var_b > 1e-6:
            slope = max((self.sby / self.sw - mean_b * mean_y) / var_b, 0.0)
        return max(mean_y + slope * (batch - mean_b), 0.0)


@dataclass(slots=True)
class Ticket:
    """An admitted request: what was predicted (s; None while learning) and the prefill model
    that counts it in its queue (`started` on admission, `ended` with its prefill leg)."""

    prefill: Worker
    model: PrefillModel
    tokens: float
    priority: Priority
    ttft: float | None
    tpot: float | None
    prefill_done: float | None  # the predicted prefill part of the TTFT


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request is refused: `reason` (ttft or tpot), the prediction and the limit (s), and
    when to retry (whole seconds)."""

    reason: str
    predicted: float
    limit: float
    retry_after: int

    def message(self, priority: Priority) -> str:
        what = "time to first token" if self.reason == "ttft" else "time per output token"
        return (
            f"pdkit lb is at capacity: predicted {what} {self.predicted:.2g} s is over the "
            f"{self.limit:.2g} s this request may take ({priority} priority, admission on); "
            f"retry after {self.retry_after} s"
        )


class Admission:
    """The models of every worker and the decision for each request."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._prefills: dict[str, PrefillModel] = {}
        self._decodes: dict[str, DecodeModel] = {}
        self.gap = 0.0  # EWMA of first token minus prefill end (s)
        self._gap_samples = 0

    def prefill_model(self, worker: Worker) -> PrefillModel:
        model = self._prefills.get(worker.url)
        if model is None:
            model = self._prefills[worker.url] = PrefillModel()
        return model

    def decode_model(self, worker: Worker) -> DecodeModel:
        model = self._decodes.get(worker.url)
        if model is None:
            model = self._decodes[worker.url] = DecodeModel()
        return model

    def forget(self, url: str) -> None:
        self._prefills.pop(url, None)
        self._decodes.pop(url, None)

    # -- predictions -------------------------------------------------------------------------

    def predict_prefill(self, worker: Worker, tokens: float) -> float | None:
        """Seconds until this request's prefill ends on `worker`, None while learning."""
        model = self.prefill_model(worker)
        rate = model.rate()
        if rate is None:
            return None
        return (model.ahead() + tokens) / rate

    def predict_tpot(self, worker: Worker) -> float | None:
        model = self.decode_model(worker)
        return model.step(worker.inflight + model.external + 1)

    def decide(
        self,
        prefill: Worker,
        prefills: list[Worker],
        decode: Worker,
        tokens: float,
        priority: Priority,
    ) -> Ticket | Rejection:
        """Admit (on `prefill`, or on another of `prefills` that would meet the SLO) or reject."""
        budget = self.config.budget(priority)
        ttft_limit = self.config.ttft * budget
        tpot = self.predict_tpot(decode)
        tpot_limit = self.config.tpot * budget
        if tpot is not None and tpot > tpot_limit:
            return Rejection("tpot", tpot, tpot_limit, 1)
        done = self.predict_prefill(prefill, tokens)
        if done is not None and done + self.gap > ttft_limit and len(prefills) > 1:
            best = min(prefills, key=lambda w: self.predict_prefill(w, tokens) or 0.0)
            best_done = self.predict_prefill(best, tokens)
            if best is not prefill and (best_done is None or best_done < done):
                prefill, done = best, best_done
        ttft = None if done is None else done + self.gap
        if ttft is not None and ttft > ttft_limit:
            return Rejection("ttft", ttft, ttft_limit, max(1, math.ceil(ttft - ttft_limit)))
        return Ticket(prefill, self.prefill_model(prefill), tokens, priority, ttft, tpot, done)

    # -- observations ------------------------------------------------------------------------

    def first_token(self, ticket: Ticket, prefill_end: float | None, first_at: float) -> None:
        """A stream's first token went out at `first_at`; its prefill leg ended at
        `prefill_end` (monotonic s): learn the gap between them."""
        if prefill_end is None:
            return
        gap = max(first_at - prefill_end, 0.0)
        self._gap_samples += 1
        weight = max(1 / self._gap_samples, 0.05)
        self.gap += (gap - self.gap) * weight

    def stream_ended(
        self, decode: Worker, batch: float, events: int, first: float, last: float
    ) -> None:
        """A stream of `events` token events ended; its decode ran `batch` requests."""
        if events < 2 or last <= first:
            return
        self.decode_model(decode).observe(batch, (last - first) / (events - 1), last)

    def gauges(self) -> tuple[dict[str, PrefillModel], dict[str, DecodeModel]]:
        return self._prefills, self._decodes


def prompt_size(pd: PdRequest) -> float:
    """The prompt's token count: exact where the router knows its ids (`pd.ids`), else the
    estimate of `prompt_tokens`."""
    return float(len(pd.ids)) if pd.ids else prompt_tokens(pd.body, pd.path)


def prompt_tokens(body: dict[str, object], path: str) -> float:
    """Prompt length estimate: token ids counted, text as UTF-8 bytes / 4 (a batch summed)."""
    if path.endswith("/chat/completions"):
        size = 0
        messages = body.get("messages")
        if isinstance(messages, list):
            for message in messages:
                content = message.get("content") if isinstance(message, dict) else None
                if isinstance(content, str):
                    size += len(content.encode()) + 16
                elif isinstance(content, list):
                    for part in content:
                        text = part.get("text") if isinstance(part, dict) else None
                        if isinstance(text, str):
                            size += len(text.encode())
                    size += 16
        return max(size / BYTES_PER_TOKEN, 1.0)
    prompt = body.get("prompt") if path.endswith("/completions") else body.get("text")
    if prompt is None and not path.endswith("/completions"):
        prompt = body.get("input_ids")
    return max(_length(prompt), 1.0)


def _length(prompt: object) -> float:
    if isinstance(prompt, str):
        return len(prompt.encode()) / BYTES_PER_TOKEN
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], int):
            return float(len(prompt))
        return sum(_length(item) for item in prompt)
    return 0.0
