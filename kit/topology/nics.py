"""Which RDMA devices a worker process's transfer engine uses: decided here once, from
`transfer.ib_devices` and the host's `rdma_devices` / `gpu_nics`. Validation checks the choice,
rendering turns it into `--disaggregation-ib-device`, and the Plan records it for provisioning.

Modes (`transfer.ib_devices`):
- a list: these devices on every host;
- ``per_gpu``: each GPU's device from the host's `gpu_nics` (the per-GPU JSON map);
- ``host``: all of the host's `rdma_devices`;
- unset: ``per_gpu`` where the host has `gpu_nics`, else ``host``.
The RDMA backends (`RDMA_BACKENDS`: mooncake, and nixl through UCX) get devices;
``mooncake_tcp`` uses none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kit.topology.schema import Host, Topology

NicMode = Literal["list", "per_gpu", "host"]
RDMA_BACKENDS = ("mooncake", "nixl")
"""Transfer backends that move KV over RDMA devices."""


@dataclass(frozen=True)
class NicChoice:
    """The devices of one process. `per_gpu` maps GPU -> device in per_gpu mode (empty
    otherwise); `devices` are the distinct devices in first-use order; `unmapped_gpus` are GPUs
    of the process that per_gpu mode found no device for."""

    mode: NicMode
    devices: tuple[str, ...]
    per_gpu: dict[int, str] = field(default_factory=dict)
    unmapped_gpus: tuple[int, ...] = ()


def nic_mode(topology: Topology, host: Host) -> NicMode:
    """How the devices of `host` are chosen (see the module doc)."""
    chosen = topology.transfer.ib_devices
    if isinstance(chosen, tuple):
        return "list"
    if chosen == "per_gpu" or (chosen is None and host.gpu_nics):
        return "per_gpu"
    return "host"


def choose_nics(topology: Topology, host: Host, gpus: tuple[int, ...]) -> NicChoice | None:
    """The RDMA devices of a process using `gpus` on `host`; None when KV does not move over
    RDMA (mooncake_tcp)."""
    if topology.transfer.backend not in RDMA_BACKENDS:
        return None
    mode = nic_mode(topology, host)
    if mode == "list":
        listed = topology.transfer.ib_devices
        assert isinstance(listed, tuple)
        return NicChoice(mode, tuple(dict.fromkeys(listed)))
    if mode == "per_gpu":
        mapped = {g: host.gpu_nics[g] for g in gpus if g in host.gpu_nics}
        missing = tuple(g for g in gpus if g not in host.gpu_nics)
        return NicChoice(mode, tuple(dict.fromkeys(mapped.values())), mapped, missing)
    return NicChoice(mode, tuple(dict.fromkeys(host.rdma_devices)))
