"""pdkit's prefill/decode load balancer for SGLang (`pdkit lb`, `python -m kit.lb`).

Public API: `main(argv)` runs it as a process; `parse_args` builds an `LbConfig`;
`LoadBalancer(config).make_server()` gives its aiohttp low-level server (for embedding and
tests; call `start()` first and `close()` after); `serve(config)` runs it inside an existing
event loop.

Modules:

run        the process: parse the command line, serve, drain on SIGTERM; config: LbConfig and
           the command line (its options: `kit.topology.router_options`); processes: several
           processes on one port (a supervisor, split limits, one /metrics); tls: the client
           port's certificate, read again on SIGHUP
server     the aiohttp server: routes, keys, errors, shared state; errors: the one error shape
protocol   a client body read and given its bootstrap fields (pure); exchange: one request in
           flight (Exchange) and the path headers the client gets
dispatch   a request's path: its turn, pick, admit, the prefill leg, the decode leg, the relay
prefill_queue  the queue of --prefill-max-inflight; hold: waiting for a routable worker
policies   worker selection; cache_aware: by what each prefill rank has cached (kv_index)
admission  SLO-aware admission at the door; loads: what the workers report of their load;
           limits: token buckets per client API key
legs       what an attempt sends, its connections, the error each leg ends with; upstream: the
           HTTP/1.1 client to the workers; watchdog: the legs' time limits
stream     relaying a decode's SSE stream; logprobs: the prefill's prompt logprobs merged in;
           migrate: a stream cut mid-way continued on another pair
workers    workers, their health state machine and the pool; health: active probes
admin      `/workers` at run time; info: routes that ask the workers; recent: each request's
           path for `GET /requests`
metrics    Prometheus metrics; access: the access log
"""

from kit.lb.config import LbConfig, WorkerSpec, parse_args
from kit.lb.errors import LbConfigError, LbError
from kit.lb.run import main, serve
from kit.lb.server import LoadBalancer

__all__ = [
    "LbConfig",
    "LbConfigError",
    "LbError",
    "LoadBalancer",
    "WorkerSpec",
    "main",
    "parse_args",
    "serve",
]
