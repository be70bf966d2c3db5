"""pdkit's router command line as the Plan gives it: `python -m kit.lb WORKERS SETTINGS`.

`worker_args` lists the workers in the form smg takes too (`--prefill URL BOOTSTRAP_PORT`,
`--decode URL`), so that both routers are rendered from the same list; `settings_args` are
the router's own options (the topology's `router:`), which `kit.lb.config` parses. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from kit.net import bare_host
from kit.topology.args import normalize_flag, render_args
from kit.topology.plan import WorkerProcess
from kit.topology.schema import Topology

LB_MODULE = "kit.lb"


def worker_args(workers: Iterable[WorkerProcess]) -> list[str]:
    """The worker flags of the processes that serve HTTP (node rank 0 of each instance), in
    Plan order."""
    args: list[str] = []
    for w in workers:
        if not w.serves_http:
            continue
        if w.role == "prefill":
            args += ["--prefill", w.url, str(w.bootstrap_port)]
        else:
            args += ["--decode", w.url]
    return args


def common_args(topology: Topology, policies: dict[str, str]) -> list[str]:
    """The options both routers share: where they listen and their policies (`policies`:
    role -> policy, defaults applied)."""
    router = topology.router
    args = ["--host", bare_host(router.bind), "--port", str(router.port)]
    return [*args, "--prefill-policy", policies["prefill"], "--decode-policy", policies["decode"]]


def extra_args(topology: Topology) -> list[str]:
    """The topology's `router.args`, rendered like every `args:`."""
    return render_args({normalize_flag(k): v for k, v in topology.router.args.items()})


def admission_args(topology: Topology) -> list[str]:
    """pdkit router flags for `router.admission` (none when it is off); the SLO targets default
    to the topology's `slo`."""
    admission = topology.router.admission
    if not admission.enabled:
        return []
    ttft = admission.ttft_ms or topology.slo.ttft_ms
    tpot = admission.tpot_ms or topology.slo.tpot_ms
    return [
        "--admission",
        "--slo-ttft-ms",
        f"{ttft:g}",
        "--slo-tpot-ms",
        f"{tpot:g}",
        "--admission-margin",
        f"{admission.margin:g}",
    ]


def settings_args(topology: Topology, policies: dict[str, str]) -> list[str]:
    """pdkit's router options: listen address, policies, admission, then `router.args`."""
    return common_args(topology, policies) + admission_args(topology) + extra_args(topology)
