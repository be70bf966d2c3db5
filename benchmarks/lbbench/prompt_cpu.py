"""The router's CPU for a prompt's token ids and its block hashes, in this process (no network):
what `kit.lb` spends on one request before it sends it, for a 4,000-token prompt.

Per workload, the median over its requests (a shared machine's noise moves the mean) of the
process's CPU time (all its threads: the tokenizer's own included; wall time on a shared
machine measures the other tenants) for:
- `tokenize`: the body parsed and its ids made (`parse_request`, then `prompt_ids` with the
  model's tokenizer, as the server does once per request);
- `hash`: the prompt's block hashes at the page size (`KvIndex.block_hashes`, chunks of a
  recurring prefix remembered);
- `route`: `CacheAware.plan` + `begin` + `end` over two prefills whose index holds the shared
  prefix (its hashing, with the index's memory of chunks; the look-ups on every rank; the
  pending record).

Workloads, each request with its own unique part (so nothing of it is cached but the shared):
- `chat`: /v1/chat/completions, a ~3,500-token system prompt shared by all, ~500 tokens of user
  message;
- `completions`: /v1/completions, the same text as one prompt string (no added token splits it,
  so the tokenizer sees all of it every time);
- `completions_cold`: a 4,000-token prompt string of which nothing recurs (its words do: the
  tiny model's corpus, as in most text, where the router's word cache knows them);
- `new_words`: a 4,000-token prompt string of made-up words (random letters), none seen
  before: what the word cache (`kit.lb.words`) costs where it knows nothing;
- `ids`: /generate with `input_ids` (no tokenization), the same shared prefix.
The target (#34): tokenize + hash under 1 ms for a 4,000-token prompt.
"""

from __future__ import annotations

import json
import random
import statistics
import string
import time
from dataclasses import dataclass
from pathlib import Path

from kit.kvevents import wire
from kit.kvevents.blocks import BlockHasher
from kit.lb.cache_aware import CacheAware
from kit.lb.config import WorkerSpec
from kit.lb.kv_index import KvIndex
from kit.lb.protocol import parse_request
from kit.lb.tokenizer import ModelTokenizer
from kit.lb.workers import Worker

_CORPUS = (
    "the quick brown fox jumps over the lazy dog prefill and decode run on separate servers "
    "the kv cache moves between them sglang serves a language model over http with an openai "
    "compatible api mooncake transfers what is the capital of france write a short poem about "
    "the sea you are a helpful assistant answer briefly"
)
WORDS = tuple(_CORPUS.split(" "))
"""Words of the tiny model's tokenizer corpus: text of realistic tokens per character."""
SHARED_TOKENS = 3500
PROMPT_TOKENS = 4000
PAGE_SIZES = (1, 16)
WORKLOADS = ("chat", "completions", "completions_cold", "new_words", "ids")


@dataclass
class PromptCpu:
    """One workload at one page size: median CPU milliseconds per request."""

    workload: str
    page_size: int
    tokens: float
    tokenize_ms: float
    hash_ms: float
    route_ms: float


def _made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))


def _text(tokenizer: ModelTokenizer, rng: random.Random, tokens: int, made_up: bool = False) -> str:
    """Words drawn from the tiny model's corpus (or made up) until the text is about `tokens`
    tokens."""
    words: list[str] = []
    text = ""
    while len(tokenizer.encode_text(text)) < tokens:
        more = max(8, (tokens - len(words)) // (12 if made_up else 4))
        words += [_made_up_word(rng) if made_up else rng.choice(WORDS) for _ in range(more)]
        text = " ".join(words)
    while len(tokenizer.encode_text(text)) > tokens:
        words.pop()
        text = " ".join(words)
    return text


def _bodies(
    workload: str, tokenizer: ModelTokenizer, shared: str, rng: random.Random, n: int
) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        if workload in ("completions_cold", "new_words"):
            prompt = f"{i} " + _text(tokenizer, rng, PROMPT_TOKENS - 2, workload == "new_words")
            out.append(("/v1/completions", {"prompt": prompt, "max_tokens": 16}))
            continue
        unique = f"{i} " + _text(tokenizer, rng, PROMPT_TOKENS - SHARED_TOKENS - 12)
        if workload == "chat":
            messages = [
                {"role": "system", "content": shared},
                {"role": "user", "content": unique},
            ]
            out.append(("/v1/chat/completions", {"messages": messages, "max_tokens": 16}))
        elif workload == "completions":
            out.append(("/v1/completions", {"prompt": shared + " " + unique, "max_tokens": 16}))
        else:
            ids = tokenizer.encode_text(shared + " " + unique)
            out.append(("/generate", {"input_ids": ids, "sampling_params": {}}))
    return [(path, json.dumps(body).encode()) for path, body in out]


def _stored(hashes: list[int], page_size: int) -> wire.KVEventBatch:
    event = wire.BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=page_size,
        lora_id=None,
        medium=wire.GPU,
    )
    return wire.KVEventBatch(ts=0.0, events=[event])


def measure(model: Path, requests: int = 40, seed: int = 0) -> list[PromptCpu]:
    """Every workload at every page size (see the module docstring)."""
    tokenizer = ModelTokenizer.load(model)
    # The texts are sized with a tokenizer of their own: what sizing encodes must not be in the
    # measured one's caches (a "cold" prompt would be warm).
    sizer = ModelTokenizer.load(model)
    rng = random.Random(seed)
    shared = _text(sizer, rng, SHARED_TOKENS)
    rows = []
    for workload in WORKLOADS:
        for page_size in PAGE_SIZES:
            bodies = _bodies(workload, sizer, shared, rng, requests + 1)  # unseen ones
            rows.append(_one(workload, page_size, tokenizer, shared, bodies))
    return rows


def _one(
    workload: str,
    page_size: int,
    tokenizer: ModelTokenizer,
    shared: str,
    bodies: list[tuple[str, bytes]],
) -> PromptCpu:
    workers = [Worker(WorkerSpec(f"http://10.0.0.{i}:30000", "prefill", 8998)) for i in (1, 2)]
    index = KvIndex()
    for worker in workers:
        cache = index.add(worker.url, page_size, 1)
        cache.live = True
    held = index.block_hashes(tokenizer.encode_text(shared), page_size)
    index.workers[workers[0].url].ranks[0].receive(0, _stored(held, page_size))
    policy = CacheAware(index, random.Random(1), tokenizer=tokenizer)
    # The first request warms what a running router has warm (the shared prefix's pieces).
    tokens: list[int] = []
    tokenize: list[float] = []
    hashing: list[float] = []
    route: list[float] = []
    hasher = BlockHasher()  # the route's own hashing is the index's: both see a warm prefix
    for n, (path, raw) in enumerate(bodies):
        t0 = time.process_time()
        pd = parse_request(path, raw)
        pd.ids = tokenizer.prompt_ids(path, pd.body)
        t1 = time.process_time()
        assert pd.ids is not None
        hasher(pd.ids, page_size, (len(pd.ids) - 1) // page_size)
        t2 = time.process_time()
        choice = policy.plan(workers, pd, None)
        policy.begin(choice)
        policy.end(choice, served=True)
        t3 = time.process_time()
        if n:
            tokens.append(len(pd.ids))
            tokenize.append(t1 - t0)
            hashing.append(t2 - t1)
            route.append(t3 - t2)
    return PromptCpu(
        workload,
        page_size,
        statistics.mean(tokens),
        statistics.median(tokenize) * 1e3,
        statistics.median(hashing) * 1e3,
        statistics.median(route) * 1e3,
    )


def lines(rows: list[PromptCpu]) -> list[str]:
    """The table the bench prints."""
    out = [
        "Router CPU for a prompt's ids and block hashes (in process, ms per request; "
        "target: tokenize + hash < 1 ms at 4,000 tokens):",
        f"  {'workload':<17} {'page':>4} {'tokens':>6} {'tokenize':>9} {'hash':>6} "
        f"{'tok+hash':>9} {'route':>6}",
    ]
    for r in rows:
        out.append(
            f"  {r.workload:<17} {r.page_size:>4} {r.tokens:>6.0f} {r.tokenize_ms:>9.3f} "
            f"{r.hash_ms:>6.3f} {r.tokenize_ms + r.hash_ms:>9.3f} {r.route_ms:>6.3f}"
        )
    return out
