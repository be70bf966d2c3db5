"""`cache_aware`: route a prefill by what each prefill DP rank has cached (`kit.lb.kv_index`)
against the prefill work already queued there.

For a prompt of L tokens, each candidate (worker w, DP rank r) costs

    cost(w, r) = queued(w, r) + 2 * (L - cached(w, r))

tokens: `queued` is the uncached prompt tokens this router has sent to (w, r) whose prefill has
not been computed yet. `queued + (L - cached)` is the prefill work ahead of the request's first
token on (w, r); the second `L - cached` is the work it leaves queued there for the requests
that come after it. Counting only the first, a request whose prefix is cached (or being
computed) on a busy rank went to an idle one and computed the prefix again, as fast for itself
but at the cost of everyone queued behind it there; Dynamo's KV router scores a worker the same
way (the request's new prefill blocks plus the worker's active blocks with the request added,
overlap weight 1). So a rank holding the prefix keeps it until its queue is about twice the
prefix's compute. A request's tokens leave `queued` when the
rank's KV events report its prompt stored (the compute is done; its KV may still be on its way
to the decode) or when its prefill leg ends, whichever is first.

`cached(w, r)` counts the blocks the rank's events reported and the pending ones: blocks of
requests this router has sent to (w, r) that the rank has not reported yet
(`kit.lb.kv_index`). A pending block weighs as much as a cached one: SGLang matches a waiting
request's prefix when it schedules it, after the earlier requests ahead of it on the rank, so
by the time a request queued behind the first one with its prefix runs, that prefix is
normally computed; and the first one's compute is already in `queued(w, r)`, so the
request is charged the wait for it. (A request batched together with the first one, or in
SGLang's overlapped next batch, computes the prefix again: the router cannot see batches, and
the agreement counters in /metrics show how often that happens.)

The lowest cost wins; ties go to the rank with more cached, then to the worker
`prefix_affinity` would pick for the prompt (so that a prefix no one has cached yet lands where
the next request with it will look), then to the lower rank.
The rank is chosen through the bootstrap room (`room % dp == r`, SGLang's
`follow_bootstrap_room`).

A worker whose index is not live (no events, a gap being rebuilt, restarted, silent) is a
candidate with nothing cached and its rank left to chance; with no live index at all, or no
token ids for the prompt, the choice is `prefix_affinity`'s.

Token ids: a `/generate` body's `input_ids` or a completions prompt of ids; for text, the served
model's tokenizer (`--prompt-tokens model:PATH`, `kit.lb.tokenizer`), or in front of emulated
workers the sim's (`kit.byte_tokenizer`, with the vocabulary their `/server_info` reports, or
`--prompt-tokens sim:VOCAB`). Without either, text prompts route by `prefix_affinity`. The
prompt's block hashes come from the index's `BlockHasher`, which keeps those of recurring
chunks (a shared system prompt or document is not hashed again per request).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.byte_tokenizer import encode, render_chat
from kit.lb.kv_index import KvIndex, Pending, WorkerCache
from kit.lb.policies import PrefixAffinity, _mix64, prefix_hash
from kit.lb.protocol import CHAT, GENERATE, PdRequest
from kit.lb.tokenizer import ModelTokenizer
from kit.lb.workers import Worker


@dataclass(slots=True)
class Choice:
    """Where cache_aware sent one attempt, what it predicted, and its share of the queue."""

    worker: Worker
    dp_rank: int | None  # None: the room is random (no live index for the worker)
    dp_size: int
    prompt_tokens: int
    predicted: int  # cached tokens the index predicts on (worker, rank); -1: no prediction
    pending: int = 0  # of `predicted`, tokens in blocks still pending there (not reported)
    cache: WorkerCache | None = None  # the worker's index when the rank was chosen by it
    hashes: list[int] | None = None  # the prompt's leading block hashes at its block size
    record: Pending | None = None  # the blocks this attempt will store, pending on the rank
    released: bool = False

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - max(self.predicted, 0)


def prompt_ids(
    pd: PdRequest, vocab: int | None, tokenizer: ModelTokenizer | None = None
) -> list[int] | None:
    """The prompt's token ids as the workers see them, or None when the router cannot know
    them (text without a tokenizer, a batch, a chat shape the model tokenizer does not
    reproduce). The model's tokenizer wins over the sim's."""
    if pd.ids is not None or pd.batch_size is not None:
        return pd.ids
    body = pd.body
    if tokenizer is not None:
        return tokenizer.prompt_ids(pd.path, body)
    if pd.path == GENERATE:
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
            return ids
        text = body.get("text")
    elif pd.path == CHAT:
        messages = body.get("messages")
        text = render_chat(messages) if isinstance(messages, list) else None
    else:
        text = body.get("prompt")
        if isinstance(text, list) and text and all(isinstance(t, int) for t in text):
            return text
    if vocab is None or not isinstance(text, str):
        return None
    return encode(text, vocab)


class CacheAware:
    name = "cache_aware"
    needs_key = True

    def __init__(
        self,
        index: KvIndex,
        rng: random.Random,
        *,
        load_factor: float = 1.25,
        vocab: int | None = None,
        tokenizer: ModelTokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.vocab = vocab
        self.tokenizer = tokenizer
        self._fallback = PrefixAffinity(rng, load_factor)
        self._queued: dict[tuple[str, int | None], int] = {}
        self._clock = clock

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        """Without the request (the Policy protocol): prefix_affinity's choice."""
        return self._fallback.choose(workers, key)

    def plan(self, workers: Sequence[Worker], pd: PdRequest, key: bytes | None) -> Choice:
        """The (worker, rank) for this request (see the module docstring)."""
        now = self._clock()
        self.index.expire(now)
        caches = {w.url: self.index.live(w.url, now) for w in workers}
        vocab = self.vocab
        if vocab is None:
            vocab = next((c.sim_vocab for c in caches.values() if c and c.sim_vocab), None)
        ids = prompt_ids(pd, vocab, self.tokenizer)
        if ids is None or not any(caches.values()):
            worker = self._fallback.choose(workers, key)
            return Choice(worker, None, 1, len(ids) if ids else 0, -1)
        length = len(ids)
        h = prefix_hash(key) if key is not None else 0
        best: tuple[tuple[int, int, int, int], Worker, int | None, int, int] | None = None
        hashed: dict[int, list[int]] = {}
        for worker in workers:
            cache = caches[worker.url]
            affinity = _mix64(h ^ worker.affinity_seed)
            if cache is None:
                ranks: list[tuple[int | None, int]] = [(None, 0)]
                dp = 1
            else:
                ranks = list(enumerate(self.index.predict(cache, ids, hashed)))
                dp = cache.dp_size
            for rank, cached in ranks:
                cost = self._queued.get((worker.url, rank), 0) + 2 * (length - cached)
                # Lower wins: cost, then more cached, then prefix_affinity's order, then rank.
                score = (cost, -cached, -affinity, rank if rank is not None else 0)
                if best is None or score < best[0]:
                    best = (score, worker, rank, dp, cached)
        assert best is not None  # workers is non-empty
        _, worker, rank, dp, cached = best
        cache = caches[worker.url]
        if rank is None or cache is None:
            return Choice(worker, None, dp, length, -1)
        hashes = hashed.get(cache.block_size)
        pending = 0
        if hashes and cached:
            pending = cached - cache.ranks[rank].cached_blocks(hashes, pending=False) * (
                cache.block_size
            )
        return Choice(worker, rank, dp, length, cached, pending, cache, hashes)

    def begin(self, choice: Choice) -> None:
        """The attempt was sent: its uncached tokens join (worker, rank)'s queue, and its
        prompt's blocks are pending on the rank until its events report them."""
        now = self._clock()
        key = (choice.worker.url, choice.dp_rank)
        self._queued[key] = self._queued.get(key, 0) + choice.uncached
        cache, rank = choice.cache, choice.dp_rank
        if cache is not None and rank is not None and choice.hashes:
            choice.record = self.index.expect(
                cache, rank, choice.hashes, now, lambda: self._release(choice)
            )
            if choice.record is not None:  # its events are due (the silence rule)
                self.index.routed(choice.worker.url, now)

    def end(self, choice: Choice, served: bool) -> None:
        """Its prefill leg ended: `served` (answered 2xx), or failed or cancelled."""
        self._release(choice)
        if choice.record is not None:
            self.index.settle(choice.record, served, self._clock())

    def _release(self, choice: Choice) -> None:
        """Its tokens leave the queue (computed, or the leg ended), once."""
        if choice.released:
            return
        choice.released = True
        key = (choice.worker.url, choice.dp_rank)
        left = self._queued.get(key, 0) - choice.uncached
        if left > 0:
            self._queued[key] = left
        else:
            self._queued.pop(key, None)

    def queued(self, url: str) -> int:
        """Uncached prompt tokens in flight on `url`, all ranks."""
        return sum(n for (u, _), n in self._queued.items() if u == url)
