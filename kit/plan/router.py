"""The Plan's router process: pdkit's (`kit.lb.render`) or smg, the Rust SGLang Model Gateway,
whose command line is rendered here. Pure.

Both take the same worker flags; the Plan stores them (`worker_args`) apart from the router's
own settings (`settings_args`), and composes `command.args` from the two: `pdkit up` changes
the workers through the router's API, and restarts the router only when its settings change.
"""

from __future__ import annotations

from pathlib import Path

from kit.lb import render as lb
from kit.net import bare_host
from kit.topology.layout import ROUTER_PROCESS, HostLayout, unit_name
from kit.topology.plan_types import Command, RouterProcess, WorkerProcess
from kit.topology.policies import DEFAULT_POLICIES
from kit.topology.schema import Topology

SMG_EXECUTABLE = "smg"
SMG_REQUIREMENT = "smg==1.13.0"
"""What provisioning installs into the router host's venv for `router.kind: smg` (the version
pdkit renders smg's flags for)."""
SMG_LAUNCH = ("launch", "--pd-disaggregation")
"""smg's subcommand and mode: they come first, the workers right after."""
ROUTER_API_KEY_ENV = "PDKIT_ROUTER_API_KEY"
"""The variable that holds the router's client API key on the router host (env file 0600)."""


def smg_settings_args(topology: Topology, policies: dict[str, str]) -> list[str]:
    """smg's own options after `launch --pd-disaggregation`: listen address, policies, its
    Prometheus listener, retries and circuit breaker (`router.faults`), then `router.args`."""
    router = topology.router
    metrics = ["--prometheus-host", bare_host(router.bind)]
    metrics += ["--prometheus-port", str(router.metrics_port)]
    return (
        lb.common_args(topology, policies)
        + metrics
        + lb.smg_fault_args(topology)
        + lb.extra_args(topology)
    )


def build_router(
    topology: Topology, workers: list[WorkerProcess], layout: HostLayout, topology_dir: Path
) -> RouterProcess:
    """The router of a validated topology, listing `workers`; `topology_dir` is the topology
    file's folder (a relative `router.api_key_file` is taken from there)."""
    router = topology.router
    host = topology.host(topology.router_host)
    policies = {
        role: getattr(router, f"{role}_policy") or DEFAULT_POLICIES[router.kind][role]
        for role in ("prefill", "decode")
    }
    workers_ = tuple(lb.worker_args(workers))
    has_key = bool(router.api_key_env or router.api_key_file)
    if router.kind == "pdkit":
        settings = tuple(lb.settings_args(topology, policies))
        command = Command(module=lb.LB_MODULE, args=(*workers_, *settings))
        metrics_port = None
    else:
        rest = tuple(smg_settings_args(topology, policies))
        settings = (*SMG_LAUNCH, *rest)
        command = Command(
            executable=SMG_EXECUTABLE,
            args=(*SMG_LAUNCH, *workers_, *rest),
            secret_args=(("--api-key", ROUTER_API_KEY_ENV),) if has_key else (),
        )
        metrics_port = router.metrics_port
    key_file = None
    if router.api_key_file:
        # Relative to the topology's folder, so that every stage reads the same file.
        key_file = str(topology_dir / Path(router.api_key_file).expanduser())
    return RouterProcess(
        name=ROUTER_PROCESS,
        kind=router.kind,
        host=host.name,
        address=bare_host(host.address),
        bind=bare_host(router.bind),
        port=router.port,
        metrics_port=metrics_port,
        prefill_policy=policies["prefill"],
        decode_policy=policies["decode"],
        api_key_env=router.api_key_env,
        api_key_file=key_file,
        unit=unit_name(topology.name, ROUTER_PROCESS),
        log_path=layout.log_file(ROUTER_PROCESS),
        command=command,
        worker_args=workers_,
        settings_args=settings,
        env={},
        hold_timeout_s=router.faults.hold_timeout_s if router.kind == "pdkit" else 0.0,
    )
