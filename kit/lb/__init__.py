"""pdkit's prefill/decode load balancer for SGLang (`pdkit lb`, `python -m kit.lb`).

Public API: `main(argv)` runs it as a process; `parse_args` builds an `LbConfig`;
`LoadBalancer(config).make_server()` gives its aiohttp low-level server (for embedding and
tests; call `start()` first and `close()` after); `serve(config)` runs it inside an existing
event loop.
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
