"""Stream migration: what continues a stream cut mid-way on another pair, exactly.

When a decode dies or stalls after the client got some tokens, the request goes to a fresh
pair with the prompt plus the tokens already sent, and the new decode's events are rewritten
so that the client sees one unbroken stream (text and ids so far, usage counted from the
original prompt). What SGLang 0.5.23 accepts decides where that is exact:

- `/generate` with `input_ids` (one sequence, `n` 1): exact. The events carry the cumulative
  `text` and `output_ids` (`incremental_streaming_output` off, the default), so the last
  event relayed holds every token sent; the continuation is `input_ids` = prompt + those ids
  with `max_new_tokens` reduced by their count (SGLang's default is 128). The new decode's
  text starts where the old one stopped: SGLang's detokenizer decodes the output against the
  prompt's last tokens (`surr_offset`), so the pieces concatenate to the unbroken text.
- `/generate` with `text`: not exact. The ids of the prompt are not in the events unless
  `return_prompt_token_ids` is asked (then in every event, the whole prompt each time), and
  re-tokenizing prompt + generated text may give other tokens than were sampled.
- `/v1/completions` and `/v1/chat/completions`: exact where the router follows the stream's
  ids (`kit.lb.openai_stream`: completions legs asked for `return_token_ids`, chat bridged
  through completions with the router's prompt ids); the continuation is the completions
  request for the prompt plus the ids sent, its chunks rejoined by that module. Not where the
  router has no prompt ids (text without a tokenizer), nor for `n` > 1, logprobs, echo,
  tools, a response format or reasoning options: their chunks carry nothing exact to go on
  from (chat returns its output ids only at the end, `continue_final_message` re-tokenizes
  the assistant's partial text).

Where it is not exact, the stream ends with an error event that says so.

A cut stream's migration (`Migration.migrate`, called by `kit.lb.dispatch` when a relayed
stream breaks):

1. Refuse it, with the reason counted, when migration is off, the cut was a limit of the
   request rather than a decode's failure, the retry budget is spent, or the continuation
   would not be exact (`refusal`).
2. Read what the client got from the last event relayed (`sent_so_far`) and build the
   request that continues it (`continuation`); with nothing left to generate, just end the
   stream.
3. Choose a fresh pair (avoiding the workers that failed in this request) and send both legs
   with new bootstrap fields (`Migration._continue`).
4. Relay the new decode's events into the client's stream, rewritten by `Rejoin`; a failure
   there counts against its worker and goes back to 1.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from typing import Any, Protocol

from kit.lb.config import LbConfig, Role
from kit.lb.errors import ApiError, LegError
from kit.lb.exchange import Exchange
from kit.lb.legs import Legs, Pair, Send, first_event_error
from kit.lb.metrics import LbMetrics
from kit.lb.protocol import GENERATE, Merge, PdRequest, parse_request
from kit.lb.recent import PathRecord, RecentRequests
from kit.lb.stream import EventRewriter, StreamRelay
from kit.lb.upstream import Connection, UpstreamError
from kit.lb.workers import Worker, WorkerPool

# The router logs a migration as part of its dispatch (the name is in every line of its log).
log = logging.getLogger("kit.lb.dispatch")

# SGLang's default max_new_tokens (sampling_params.py) when the request gives none.
DEFAULT_MAX_NEW_TOKENS = 128


def refusal(pd: PdRequest, followed: bool = False) -> str | None:
    """Why a cut stream of this request cannot be continued exactly (None: it can);
    `followed`: an OpenAI stream whose ids the router follows."""
    if pd.path != GENERATE:
        if followed:
            return None
        return (
            "the router does not follow this stream's token ids (no prompt ids: text without "
            "the model's tokenizer; or n > 1, logprobs, echo, tools, a response format; or a "
            "chat with --no-chat-bridge, the workers parsing reasoning or tool calls)"
        )
    body = pd.body
    if pd.batch_size is not None:
        return "a batched /generate"
    ids = body.get("input_ids")
    if not isinstance(ids, list) or body.get("text") is not None:
        return "the prompt is text, not input_ids"
    params = body.get("sampling_params") or {}
    if (params.get("n") or 1) != 1:
        return "parallel samples (n > 1)"
    if pd.merge is not Merge.NONE:
        return "logprobs are asked"
    return None


@dataclass(frozen=True, slots=True)
class Sent:
    """What the client got so far: the cumulative text and ids, and the original usage."""

    text: str
    output_ids: list[int]
    prompt_tokens: int


def last_event(data: bytes) -> dict[str, Any] | None:
    """The last JSON `data:` event of a relayed piece of stream (None when there is none)."""
    for line in reversed(data.split(b"\n")):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload and payload != b"[DONE]":
                try:
                    event = json.loads(payload)
                except ValueError:
                    return None
                return event if isinstance(event, dict) else None
    return None


def sent_so_far(pd: PdRequest, last: bytes | None) -> Sent:
    """What the client got, from the last events relayed (`/generate` events are cumulative)."""
    event = last_event(last) if last else None
    prompt = len(pd.body["input_ids"])
    if event is None:
        return Sent("", [], prompt)
    ids = event.get("output_ids")
    meta = event.get("meta_info")
    if not isinstance(meta, dict):
        meta = {}
    text = event.get("text")
    return Sent(
        text if isinstance(text, str) else "",
        [int(t) for t in ids] if isinstance(ids, list) else [],
        int(meta.get("prompt_tokens", prompt)),
    )


def continuation(pd: PdRequest, sent: Sent) -> PdRequest | None:
    """The request that continues the stream after `sent` (None: nothing is left to
    generate)."""
    body = dict(pd.body)
    params = dict(body.get("sampling_params") or {})
    budget = params.get("max_new_tokens")
    left = (budget if isinstance(budget, int) else DEFAULT_MAX_NEW_TOKENS) - len(sent.output_ids)
    if left <= 0:
        return None
    params["max_new_tokens"] = left
    if isinstance(params.get("min_new_tokens"), int):
        params["min_new_tokens"] = max(params["min_new_tokens"] - len(sent.output_ids), 0)
    body["sampling_params"] = params
    body["input_ids"] = [*pd.body["input_ids"], *sent.output_ids]
    raw = json.dumps(body, separators=(",", ":")).encode()
    return parse_request(pd.path, raw)


class Rejoin:
    """Rewrites the continuation's events into the original stream's: text and ids so far
    in front, usage as if from the original prompt. Has `StreamMerger`'s `event` shape."""

    def __init__(self, sent: Sent) -> None:
        self.sent = sent

    def event(self, payload: bytes) -> bytes:
        try:
            event = json.loads(payload)
        except ValueError:
            return payload
        if not isinstance(event, dict) or "error" in event:
            return payload
        sent = self.sent
        if isinstance(event.get("text"), str):
            event["text"] = sent.text + event["text"]
        if isinstance(event.get("output_ids"), list):
            event["output_ids"] = [*sent.output_ids, *event["output_ids"]]
        meta = event.get("meta_info")
        if isinstance(meta, dict):
            n = len(sent.output_ids)
            if isinstance(meta.get("completion_tokens"), int):
                meta["completion_tokens"] += n
            if isinstance(meta.get("prompt_tokens"), int):
                meta["prompt_tokens"] = sent.prompt_tokens
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


class Pairs(Protocol):
    """What a migration needs from the dispatcher (`kit.lb.dispatch.Dispatcher`)."""

    async def pick(
        self, ex: Exchange, role: Role, key: bytes | None, exclude: set[str]
    ) -> Worker: ...

    def start(self, ex: Exchange, prefill: Worker, send: Send, keep: bool) -> Pair: ...

    def blame(self, worker: Worker, error: LegError) -> None: ...


class Migration:
    """Continues cut streams on fresh pairs; one per load balancer (see the module
    docstring)."""

    def __init__(
        self,
        config: LbConfig,
        *,
        pool: WorkerPool,
        metrics: LbMetrics,
        recent: RecentRequests,
        rng: random.Random,
        legs: Legs,
        pairs: Pairs,
    ) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self._recent = recent
        self._rng = rng
        self._legs = legs
        self._pairs = pairs

    def _refusal(self, ex: Exchange, cut: ApiError) -> tuple[str, str] | None:
        """(label, why) when a cut stream is not continued; None when it is."""
        if not self._config.migrate:
            return "off", "migration is off (--no-migrate)"
        if not isinstance(cut, LegError):
            return "limit", "the request ran out of time"
        if not cut.retryable:  # a 4xx: the worker's verdict on the continuation itself
            return "limit", f"the {cut.role} answered {cut.status}"
        if ex.retries + ex.migrations >= self._config.retries:
            return "budget", f"the request used its {self._config.retries} retries (--retries)"
        why = refusal(ex.pd, ex.follow is not None and ex.follow.exact)
        if why is not None:
            return "inexact", f"a continuation would not be exact: {why}"
        return None

    async def migrate(self, ex: Exchange, relay: StreamRelay, cut: ApiError) -> ApiError | None:
        """Continue a stream whose decode died or stalled on fresh pairs, with the prompt
        plus the tokens the client got (this module); None when the stream ended well,
        else the error its last event reports. ClientGone when the client left."""
        excluded = {cut.blame} if isinstance(cut, LegError) else set()
        while True:
            refused = self._refusal(ex, cut)
            if refused is not None:
                label, why = refused
                self._metrics.migration_refused(label)
                return ApiError(
                    cut.status, f"{cut.message}; the stream was not continued: {why}", cut.cause
                )
            follow = ex.follow
            rejoin: EventRewriter
            if follow is not None:
                following = follow.continuation()
                rejoin = follow
            else:
                sent = sent_so_far(ex.pd, relay.last_data)
                following = continuation(ex.pd, sent)
                rejoin = Rejoin(sent)
            if following is None:  # every token was sent: only the end was missing
                await relay.finish()
                return None
            ex.migrations += 1
            self._metrics.migrate("stalled" if cut.cause == "decode_stalled" else "died")
            log.info("continuing a stream on another pair: %s", cut.message)
            try:
                prefill = await self._pairs.pick(ex, "prefill", None, excluded)
                decode = await self._pairs.pick(ex, "decode", None, excluded)
            except ApiError as error:
                return ApiError(
                    error.status,
                    f"{cut.message}; the stream could not be continued: {error.message}",
                    error.cause,
                )
            body, room = following.encode(prefill.bootstrap_host, prefill.bootstrap_port, self._rng)
            ex.path = PathRecord(
                ex.request_id, ex.pd.path, prefill.url, decode.url, room, ex.started
            )
            self._recent.chose(ex.path)
            send = self._legs.send(following.path_bytes, body, ex.request_id)
            if follow is not None:
                rejoin = follow.rejoin()
            try:
                await self._continue(
                    ex,
                    relay,
                    prefill=prefill,
                    decode=decode,
                    send=send,
                    rejoin=rejoin,
                )
                return None
            except LegError as error:
                worker = prefill if error.blame == prefill.url else decode
                self._pairs.blame(worker, error)
                excluded.add(worker.url)
                cut = error
            except ApiError as error:
                return error

    async def _continue(
        self,
        ex: Exchange,
        relay: StreamRelay,
        *,
        prefill: Worker,
        decode: Worker,
        send: Send,
        rejoin: EventRewriter,
    ) -> None:
        """One attempt at the rest of a stream: both legs, then the new decode's events
        rewritten into the client's stream; raises the attempt's error (LegError)."""
        pair = self._pairs.start(ex, prefill, send, False)
        guard = self._legs.watch_stream(pair, decode)
        finished = False
        upstream: Connection | None = None
        try:
            try:
                upstream = await self._legs.open("decode", decode, send, pair.decode)
            except LegError as error:
                raise self._legs.decode_failed(pair, decode, error) from None
            try:
                if upstream.status >= 300:
                    data = await upstream.read()
                    raise self._legs.decode_status(
                        pair, decode, upstream.status, upstream.content_type, data
                    )
                first = await upstream.first()
                failed = first_event_error(first)
                if failed is not None:
                    raise self._legs.decode_status(pair, decode, failed, "application/json", first)
                guard.idle = self._legs.stall_timeout
                relay.rebind(guard, decode, rejoin)
                await relay.run(upstream, first)
            except (UpstreamError, TimeoutError) as exc:
                raise self._legs.stream_failure(pair, decode, exc) from None
            except LegError as exc:
                if exc is pair.prefill_error or guard.expired:
                    raise self._legs.stream_failure(pair, decode, exc) from None
                raise
            if decode.failures:
                self._pool.record_served(decode)
            finished = True
            self._legs.finish_in_background(pair)
        finally:
            self._legs.watchdog.release(guard)
            decode.inflight -= 1
            if not finished:
                pair.cancel()
            elif upstream is not None:
                upstream.release()
