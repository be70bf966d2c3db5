"""What `pdkit size` is asked: the model, the GPUs and hosts, the SLO, the workload, an
optional target rate, and the topology the answer is written into.

The hosts come from a topology's `hosts:` section (its other sections - engine, transfer,
router, ports, args - are kept for the emitted topology), or are generic: `--gpus N` on hosts of
`--gpus-per-host` GPUs, named node-0, node-1, ... with placeholder addresses and one RDMA NIC
per GPU. Either way the problem carries a *base* topology (a YAML mapping) that every candidate
is written into before the validator checks it.

A base topology of engine sim slowed by `PDKIT_SIM_SPEED` s is sized for what that deployment
serves: the search runs the model at full speed under the SLO scaled by s, and its rates are
multiplied by s (as `kit.bench.predict` does), so the predicted goodput is the one `pdkit bench`
measures on it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.errors import PdkitError
from kit.perf.gpus import GpuSpec, gpu_spec
from kit.perf.models import ModelShape, resolve_model
from kit.perf.timing import Efficiency
from kit.perf.workload import WorkloadSpec
from kit.sglang.render import role_args
from kit.topology.args import normalize_flag
from kit.topology.load import parse_topology, read_topology_text
from kit.topology.schema import ROLE_NAMES, SLO, Topology

GENERIC_ADDRESS = "10.0.0.{}"
"""Placeholder addresses of generic hosts (node-i gets .i+1): the comments say to replace them."""


class SizingError(PdkitError):
    """`pdkit size` cannot answer: bad options, nothing fits, a run it cannot read."""


@dataclass(frozen=True)
class LaunchKnobs:
    """The launch values sizing keeps from the base topology (its args): they change what an
    instance holds but are the user's choice, not the search's."""

    page_size: int = 1
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    num_reserved_decode_tokens: int = 512


@dataclass(frozen=True)
class SizingProblem:
    """One sizing question. `slo` and `target_rate` are as the deployment sees them (wall
    time); `speed` is the sim's PDKIT_SIM_SPEED (1 for real GPUs)."""

    model: ModelShape
    gpu: GpuSpec
    base: dict[str, Any]
    slo: SLO
    workload: WorkloadSpec
    target_rate: float | None = None
    efficiency: Efficiency = field(default_factory=Efficiency)
    knobs: dict[str, LaunchKnobs] = field(default_factory=dict)
    """Per role (prefill, decode, colocated): the launch values kept from the base."""
    speed: float = 1.0
    generic_hosts: bool = False
    """True when the hosts were made up from --gpus (their addresses are placeholders)."""

    @property
    def topology(self) -> Topology:
        return Topology.model_validate(self.base)

    @property
    def gpus(self) -> int:
        """All GPUs of all hosts: the budget."""
        return sum(int(h.get("gpus", 0)) for h in self.base["hosts"])

    @property
    def gpus_per_host(self) -> int:
        return max(int(h.get("gpus", 0)) for h in self.base["hosts"])

    @property
    def rdma(self) -> bool:
        """KV moves over RDMA (else Mooncake over TCP, one host NIC)."""
        return self.topology.transfer.backend != "mooncake_tcp"

    @property
    def model_slo(self) -> SLO:
        """The SLO in model time (see the module doc)."""
        s = self.slo
        return SLO(
            ttft_ms=s.ttft_ms * self.speed, tpot_ms=s.tpot_ms * self.speed, attainment=s.attainment
        )


def generic_base(
    name: str, model_path: str, gpu: str, gpus: int, gpus_per_host: int
) -> dict[str, Any]:
    """A base topology of `gpus` GPUs on hosts of `gpus_per_host` (the last one smaller when
    they do not divide), engine sglang, Mooncake over RDMA with one NIC per GPU."""
    hosts: list[dict[str, Any]] = []
    left = gpus
    while left > 0:
        index = len(hosts)
        count = min(gpus_per_host, left)
        nics = [f"mlx5_{i}" for i in range(count)]
        hosts.append(
            {
                "name": f"node-{index}",
                "address": GENERIC_ADDRESS.format(index + 1),
                "gpus": count,
                "gpu_type": gpu,
                "rdma_devices": nics,
                "gpu_nics": dict(enumerate(nics)),
            }
        )
        left -= count
    return {
        "name": name,
        "engine": "sglang",
        "model": {"path": model_path},
        "hosts": hosts,
        "transfer": {"backend": "mooncake"},
        "router": {"port": 8000},
    }


def load_base(path: Path) -> tuple[dict[str, Any], Topology]:
    """A user's topology as a base: its YAML mapping (kept as written) and its shape-checked
    Topology (`TopologyError` with positions when the shape is wrong)."""
    text = read_topology_text(path)
    topology, _ = parse_topology(text, str(path))
    return yaml.safe_load(text), topology


def base_gpu(topology: Topology, option: str | None) -> str:
    """The GPU type: `--gpu`, else the hosts' one `gpu_type`."""
    if option:
        return option
    types = {h.gpu_type for h in topology.hosts if h.gpus > 0}
    if len(types) == 1 and None not in types:
        (only,) = types
        assert only is not None
        return only
    if None in types:
        raise SizingError(
            "the topology's hosts do not all say their gpu_type. To fix: set gpu_type on every "
            "host, or pass --gpu (e.g. --gpu H100-SXM)."
        )
    raise SizingError(
        f"the topology's hosts have different GPU types ({', '.join(sorted(map(str, types)))}); "
        "pdkit size plans for one. To fix: give a topology whose hosts share one gpu_type."
    )


def sim_speed(topology: Topology) -> float:
    """PDKIT_SIM_SPEED of a sim topology (defaults.env, or both roles' env alike), else 1."""
    if topology.engine != "sim":
        return 1.0
    speeds = set()
    for role in (topology.prefill, topology.decode):
        env = {**topology.defaults.env, **role.env}
        speeds.add(env.get("PDKIT_SIM_SPEED", "1"))
    try:
        values = {float(s) for s in speeds}
    except ValueError:
        raise SizingError(
            f"PDKIT_SIM_SPEED {', '.join(sorted(speeds))} is not a number. To fix: set a "
            "positive number (0.05: 20x slower than the GPUs)."
        ) from None
    if len(values) != 1 or min(values) <= 0:
        raise SizingError(
            "prefill and decode run at different (or non-positive) PDKIT_SIM_SPEED; the model "
            "assumes one. To fix: set PDKIT_SIM_SPEED once, under defaults.env."
        )
    return values.pop()


def knobs_of(topology: Topology, role: str) -> LaunchKnobs:
    """The launch values of a role's args (`defaults.args` under the role's own; colocated:
    `defaults.args` alone) that change what an instance holds. A value that is not a number
    is left to the validator, which reports it."""
    if role in ROLE_NAMES:
        args = role_args(topology, role)
    else:
        args = {normalize_flag(k): v for k, v in topology.defaults.args.items()}

    def number(flag: str) -> float | None:
        value = args.get(flag)
        if value is None or isinstance(value, bool | list):
            return None
        try:
            return float(value)
        except ValueError:
            return None

    page = number("page-size")
    reserved = number("num-reserved-decode-tokens")
    dtype = args.get("kv-cache-dtype")
    return LaunchKnobs(
        page_size=int(page) if page and page >= 1 else 1,
        kv_cache_dtype=str(dtype) if dtype else "auto",
        mem_fraction_static=number("mem-fraction-static"),
        num_reserved_decode_tokens=int(reserved) if reserved is not None else 512,
    )


def make_problem(
    *,
    base: dict[str, Any],
    model_path: str,
    gpu: str,
    slo: SLO,
    workload: WorkloadSpec,
    target_rate: float | None = None,
    efficiency: Efficiency | None = None,
    generic_hosts: bool = False,
) -> SizingProblem:
    """The problem for `base` (a topology mapping); `SizingError` for what cannot be sized."""
    base = copy.deepcopy(base)
    base.setdefault("model", {})["path"] = model_path
    for host in base.get("hosts", []):
        if host.get("gpus", 0) > 0:
            host["gpu_type"] = gpu
    topology = Topology.model_validate(base)
    if target_rate is not None and target_rate <= 0:
        raise SizingError("--target-rate must be above 0 requests/s.")
    spec = gpu_spec(gpu)
    return SizingProblem(
        model=resolve_model(model_path),
        gpu=spec,
        base=base,
        slo=slo,
        workload=workload,
        target_rate=target_rate,
        efficiency=efficiency or Efficiency.for_gpu(spec),
        knobs={role: knobs_of(topology, role) for role in (*ROLE_NAMES, "colocated")},
        speed=sim_speed(topology),
        generic_hosts=generic_hosts,
    )
