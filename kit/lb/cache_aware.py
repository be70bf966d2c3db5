"""`cache_aware`: route a prefill by what each prefill DP rank has cached (`kit.lb.kv_index`)
against the prefill work already queued there.

For a prompt of L tokens, each candidate (worker w, DP rank r) costs

    cost(w, r) = queued(w, r) + (L - cached(w, r))

tokens: the uncached prompt tokens this router has sent to (w, r) whose prefill has not ended
yet, plus the tokens this prompt would compute there. That is the prefill work ahead of the
request's first token on (w, r), so the cheapest rank is the one expected to answer first; a
cached token and a queued token weigh the same. The lowest cost wins; ties go to the rank with
more cached, then to the worker `prefix_affinity` would pick for the prompt (so that a prefix
no one has cached yet lands where the next request with it will look), then to the lower rank.
The rank is chosen through the bootstrap room (`room % dp == r`, SGLang's
`follow_bootstrap_room`).

A worker whose index is not live (no events, a gap being rebuilt, restarted, silent) is a
candidate with nothing cached and its rank left to chance; with no live index at all, or no
token ids for the prompt, the choice is `prefix_affinity`'s.

Token ids: a `/generate` body's `input_ids`; for text, only in front of emulated workers (the
sim's tokenizer, `kit.kvevents.prompt`, with the vocabulary their `/server_info` reports, or
`--prompt-tokens sim:VOCAB`). The router holds no model tokenizer, so text prompts in front of
real SGLang route by `prefix_affinity`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kit.kvevents.prompt import encode, render_chat
from kit.lb.kv_index import KvIndex
from kit.lb.policies import PrefixAffinity, _mix64, prefix_hash
from kit.lb.protocol import CHAT, GENERATE, PdRequest
from kit.lb.workers import Worker


@dataclass(slots=True)
class Choice:
    """Where cache_aware sent one attempt, what it predicted, and its share of the queue."""

    worker: Worker
    dp_rank: int | None  # None: the room is random (no live index for the worker)
    dp_size: int
    prompt_tokens: int
    predicted: int  # cached tokens the index predicts on (worker, rank); -1: no prediction
    released: bool = False

    @property
    def uncached(self) -> int:
        return self.prompt_tokens - max(self.predicted, 0)


def prompt_ids(pd: PdRequest, vocab: int | None) -> list[int] | None:
    """The prompt's token ids as the workers see them, or None when the router cannot know
    them (text without the sim tokenizer, a batch)."""
    if pd.batch_size is not None:
        return None
    body = pd.body
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.vocab = vocab
        self._fallback = PrefixAffinity(rng, load_factor)
        self._queued: dict[tuple[str, int | None], int] = {}
        self._clock = clock

    def choose(self, workers: Sequence[Worker], key: bytes | None) -> Worker:
        """Without the request (the Policy protocol): prefix_affinity's choice."""
        return self._fallback.choose(workers, key)

    def plan(self, workers: Sequence[Worker], pd: PdRequest, key: bytes | None) -> Choice:
        """The (worker, rank) for this request (see the module docstring)."""
        now = self._clock()
        caches = {w.url: self.index.live(w.url, now) for w in workers}
        vocab = self.vocab
        if vocab is None:
            vocab = next((c.sim_vocab for c in caches.values() if c and c.sim_vocab), None)
        ids = prompt_ids(pd, vocab)
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
                cost = self._queued.get((worker.url, rank), 0) + length - cached
                # Lower wins: cost, then more cached, then prefix_affinity's order, then rank.
                score = (cost, -cached, -affinity, rank if rank is not None else 0)
                if best is None or score < best[0]:
                    best = (score, worker, rank, dp, cached)
        assert best is not None  # workers is non-empty
        _, worker, rank, dp, cached = best
        return Choice(worker, rank, dp, length, cached if rank is not None else -1)

    def begin(self, choice: Choice) -> None:
        """The attempt was sent: its uncached tokens join (worker, rank)'s queue."""
        key = (choice.worker.url, choice.dp_rank)
        self._queued[key] = self._queued.get(key, 0) + choice.uncached
        self.index.routed(choice.worker.url, self._clock())

    def end(self, choice: Choice) -> None:
        """Its prefill leg ended (answered, failed or cancelled)."""
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
