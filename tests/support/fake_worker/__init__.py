"""A fake SGLang PD worker for the load balancer's tests and benchmarks: real sockets, no model.

One implementation for both: faithful at the HTTP level (bootstrap fields checked, a Ledger
standing in for the bootstrap server and the KV transfer, logprobs as in PD, every inference
route, stream or not, faults on demand), on raw asyncio protocols so that a benchmark measures
the router in front of it, not the fake.

- `FakeWorker`, `Ledger`: workers in the caller's event loop (tests set faults and read what
  each worker got);
- `FakeWorkerProcess`: N prefills + M decodes (+ K null workers) in a background process
  (benchmarks), also `python -m tests.support.fake_worker`;
- `MODEL`, `lp`, `out_token`, `prompt_ids`: the fake model, for tests to compute expected answers.

Modules: `http1` (the HTTP/1.1 server), `model` (tokens, logprobs, response shapes), `worker`
(one worker and the Ledger), `process` (the background process), `__main__` (its command line).
"""

from tests.support.fake_worker.model import MODEL, lp, out_token, prompt_ids
from tests.support.fake_worker.process import FakeWorkerProcess, Summary
from tests.support.fake_worker.worker import FakeWorker, Ledger

__all__ = [
    "MODEL",
    "FakeWorker",
    "FakeWorkerProcess",
    "Ledger",
    "Summary",
    "lp",
    "out_token",
    "prompt_ids",
]
