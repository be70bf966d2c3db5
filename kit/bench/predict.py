"""What `kit/perf`'s model predicts for a deployment under a workload: the same goodput search
in virtual time, on the instances the Plan starts.

Each role's instance is its launch record in the Plan (`WorkerProcess.launch`: parallelism,
the hosts' GPU type whatever the engine, memory and batching values), modelled through
`InstanceConfig.from_launch` as the sim worker models itself. The sim runs its model time at
`PDKIT_SIM_SPEED` x wall time (the record's `speed`); a deployment slowed to speed s serves
rate r under SLO (T, P) as the model at full speed serves r / s under (T x s, P x s), so the
predicted wall goodput is s x the model goodput under the scaled SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.errors import PdkitError
from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.perf.gpus import UnknownGpuError
from kit.perf.sweep import goodput, run_rate
from kit.perf.workload import WorkloadSpec
from kit.topology.plan_types import Plan, WorkerProcess
from kit.topology.schema import SLO

CEILING = 4096.0
"""Model rates searched up to (requests/s at full speed)."""


@dataclass(frozen=True)
class Prediction:
    """The model's goodput (requests/s, wall time) and the cluster it ran."""

    goodput: float
    cluster: Cluster
    speed: float

    ceiling: float

    @property
    def capped(self) -> bool:
        """The model met the SLO at every rate it tried: the workload never saturates it."""
        return self.goodput >= self.ceiling

    def describe(self) -> str:
        gpus = self.cluster.gpus
        speed = f", PDKIT_SIM_SPEED {self.speed:g}" if self.speed != 1 else ""
        if self.capped:
            return (
                f"above {self.goodput:.0f} req/s on {gpus} GPU(s){speed} (the workload is too "
                "short to saturate the modelled cluster: raise --requests)"
            )
        return f"{self.goodput:.2f} req/s on {gpus} GPU(s){speed}"


def _instance(worker: WorkerProcess) -> tuple[InstanceConfig, float]:
    if worker.launch.device == "cpu":
        raise PdkitError(
            f"{worker.name} runs on a CPU host (device: cpu); kit/perf models GPUs only"
        )
    try:
        config = InstanceConfig.from_launch(worker.launch)
    except UnknownGpuError as exc:
        raise PdkitError(f"cannot model {worker.name}: {exc}") from exc
    return config, worker.launch.speed


def plan_cluster(plan: Plan) -> tuple[Cluster, float]:
    """The Plan's instances as a virtual-time cluster, and the sim speed they run at."""
    configs: dict[str, tuple[InstanceConfig, float]] = {}
    counts = {"prefill": len(plan.role("prefill")), "decode": len(plan.role("decode"))}
    for role in ("prefill", "decode"):
        configs[role] = _instance(plan.role(role)[0])
    speeds = {speed for _, speed in configs.values()}
    if len(speeds) > 1:
        raise PdkitError(
            "prefill and decode run at different PDKIT_SIM_SPEED; the model assumes one."
        )
    cluster = Cluster(
        prefill=Instances(configs["prefill"][0], counts["prefill"]),
        decode=Instances(configs["decode"][0], counts["decode"]),
        rdma=plan.transfer_backend != "mooncake_tcp",
    )
    return cluster, speeds.pop()


def _scaled(slo: SLO, speed: float) -> SLO:
    return SLO(ttft_ms=slo.ttft_ms * speed, tpot_ms=slo.tpot_ms * speed, attainment=slo.attainment)


def predict(plan: Plan, spec: WorkloadSpec, slo: SLO) -> Prediction:
    """The model's goodput for `plan` under `spec` and `slo` (see the module doc)."""
    cluster, speed = plan_cluster(plan)
    model_goodput = goodput(cluster, spec.requests, slo=_scaled(slo, speed), ceiling=CEILING)
    return Prediction(model_goodput * speed, cluster, speed, CEILING * speed)


def predicted_attainment(plan: Plan, spec: WorkloadSpec, slo: SLO, rate: float) -> float:
    """The model's attainment (0..1) at one wall rate (requests/s)."""
    cluster, speed = plan_cluster(plan)
    summary = run_rate(cluster, rate / speed, spec.requests, slo=_scaled(slo, speed))
    return summary.attainment
