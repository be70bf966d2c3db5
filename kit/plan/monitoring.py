"""Topology `monitoring:` -> the Plan's Prometheus process and its scrape configuration. Pure.

Prometheus scrapes, every `scrape_interval_s`, one job per kind of process:

    router    pdkit's /metrics on the router's port, or smg's Prometheus port
    prefill   every node's /metrics: an instance's rank 0, and each other node of a multi-node
    decode    instance on its own --port (SGLang's ranks >= 1 serve /health and /metrics there,
              with the series of that node's schedulers); SGLang labels them per tp/pp/dp rank
    kv_pool   the KV pool's master (`kv_pool:`): its /metrics on metrics_port
    prometheus  itself
    node      a node exporter on every host (`node_exporter_port`, when set)

Every series gets the target labels `deployment`, `process` (prefill-0, router, ...; every
node of an instance carries the instance's name, so sums by `process` cover the instance) and
`host` (the topology's host name), and the nodes of a multi-node instance `node_rank`; `job`
says the role. The dashboard (`pdkit dashboard`)
queries by these names.
"""

from __future__ import annotations

import yaml

from kit.net import bare_host, host_port
from kit.sglang.hicache import pool_host
from kit.topology.layout import KV_POOL_PROCESS, MONITORING_PROCESS, HostLayout, unit_name
from kit.topology.plan_types import (
    Command,
    MonitoringProcess,
    RouterProcess,
    ScrapeJob,
    ScrapeTarget,
    WorkerProcess,
)
from kit.topology.schema import Topology

PROMETHEUS_EXECUTABLE = "prometheus"
"""Debian's `prometheus` package installs it as /usr/bin/prometheus."""
JOBS = ("router", "prefill", "decode", "kv_pool", "prometheus", "node")


def _target(address: str, port: int, labels: dict[str, str]) -> ScrapeTarget:
    return ScrapeTarget(address=host_port(address, port), labels=labels)


def _worker_labels(worker: WorkerProcess, labels: dict[str, str]) -> dict[str, str]:
    """A worker target's labels: the nodes of a multi-node instance also get `node_rank`."""
    return labels | {"node_rank": str(worker.node_rank)} if worker.nnodes > 1 else labels


def scrape_jobs(
    topology: Topology,
    workers: list[WorkerProcess],
    router: RouterProcess,
    prometheus: tuple[str, str, int],
    node_exporter_port: int | None,
) -> tuple[ScrapeJob, ...]:
    """The scrape jobs of a deployment; `prometheus` is (host name, address, port) of
    Prometheus itself."""
    name = topology.name

    def labels(process: str, host: str) -> dict[str, str]:
        return {"deployment": name, "process": process, "host": host}

    jobs = [
        ScrapeJob(
            job="router",
            metrics_path="/metrics",
            targets=(
                _target(
                    router.address,
                    router.metrics_port or router.port,
                    labels(router.name, router.host),
                ),
            ),
        )
    ]
    for role in ("prefill", "decode"):
        mine = [w for w in workers if w.role == role]
        jobs.append(
            ScrapeJob(
                job=role,
                metrics_path="/metrics",
                targets=tuple(
                    _target(
                        w.address, w.http_port, _worker_labels(w, labels(w.instance_name, w.host))
                    )
                    for w in mine
                ),
            )
        )
    pool = topology.kv_pool
    if pool is not None:
        pool_on = topology.host(pool_host(topology))
        jobs.append(
            ScrapeJob(
                job="kv_pool",
                metrics_path="/metrics",
                targets=(
                    _target(
                        bare_host(pool_on.address),
                        pool.metrics_port,
                        labels(KV_POOL_PROCESS, pool_on.name),
                    ),
                ),
            )
        )
    jobs.append(
        ScrapeJob(
            job="prometheus",
            metrics_path="/metrics",
            targets=(
                _target(prometheus[1], prometheus[2], labels(MONITORING_PROCESS, prometheus[0])),
            ),
        )
    )
    if node_exporter_port is not None:
        jobs.append(
            ScrapeJob(
                job="node",
                metrics_path="/metrics",
                targets=tuple(
                    _target(bare_host(h.address), node_exporter_port, labels("node", h.name))
                    for h in topology.hosts
                ),
            )
        )
    return tuple(jobs)


def build_monitoring(
    topology: Topology,
    workers: list[WorkerProcess],
    router: RouterProcess,
    layouts: dict[str, HostLayout],
) -> MonitoringProcess | None:
    """The Prometheus process of a validated topology, None when `monitoring:` is unset."""
    spec = topology.monitoring
    if spec is None:
        return None
    host = topology.host(spec.host or topology.router_host)
    layout = layouts[host.name]
    address, bind = bare_host(host.address), bare_host(spec.bind)
    jobs = scrape_jobs(
        topology, workers, router, (host.name, address, spec.port), spec.node_exporter_port
    )
    flags = (
        ("--config.file", layout.prometheus_config),
        ("--storage.tsdb.path", layout.prometheus_data_dir),
        ("--storage.tsdb.retention.time", spec.retention),
        ("--web.listen-address", host_port(bind, spec.port)),
    )
    return MonitoringProcess(
        name=MONITORING_PROCESS,
        host=host.name,
        address=address,
        bind=bind,
        port=spec.port,
        scrape_interval_s=spec.scrape_interval_s,
        retention=spec.retention,
        config_path=layout.prometheus_config,
        data_dir=layout.prometheus_data_dir,
        jobs=jobs,
        unit=unit_name(topology.name, MONITORING_PROCESS),
        log_path=layout.log_file(MONITORING_PROCESS),
        command=Command(executable=PROMETHEUS_EXECUTABLE, flags=flags),
        env={},
    )


def _duration(seconds: float) -> str:
    """Prometheus' duration syntax: 5s, 1500ms."""
    return f"{seconds:g}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def prometheus_config(monitoring: MonitoringProcess, deployment: str) -> str:
    """The prometheus.yml of a deployment (`pdkit render` prints it; `pdkit up` writes it)."""
    interval = _duration(monitoring.scrape_interval_s)
    config = {
        "global": {
            "scrape_interval": interval,
            # A scrape may not take longer than the interval between two.
            "scrape_timeout": _duration(min(monitoring.scrape_interval_s, 10.0)),
            "evaluation_interval": interval,
        },
        "scrape_configs": [
            {
                "job_name": job.job,
                "metrics_path": job.metrics_path,
                "static_configs": [
                    {"targets": [t.address], "labels": dict(t.labels)} for t in job.targets
                ],
            }
            for job in monitoring.jobs
            if job.targets
        ],
    }
    head = (
        f"# Managed by pdkit: Prometheus of deployment {deployment}. `pdkit up` rewrites this\n"
        "# file from the topology; `pdkit render` shows it.\n"
    )
    return head + yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=100)
