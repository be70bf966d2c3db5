"""The schema of `slurm:` (shape only): what a topology with `launcher: slurm` asks Slurm for,
and the hosts it stands for.

On a Slurm cluster the hosts are not typed by hand: they are the nodes of the one allocation
pdkit submits, known only once Slurm gives them. The topology says how many nodes (`nodes`),
and the loader stands a host in for each, `node0` ... `node<N-1>`, with the GPUs per node and a
placeholder address (`placeholder_address`). Placement, ports and the Plan are computed over
these hosts as over any others; the batch script resolves each placeholder to its node's real
address on the node at run time (kit/slurm/script.py), and `pdkit up` re-resolves the Plan with
the addresses of the nodes it got.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kit.topology.strict import Strict

TIME_LIMIT_PATTERN = r"^(\d+-)?\d+(:\d{2}){0,2}$"
"""Slurm's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""

PLACEHOLDER_PREFIX = "198.18."
"""Placeholder node addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range: never a
real host's), so that every check that wants an IP (ZMQ peers, dist-init) treats them as one."""


def placeholder_address(index: int) -> str:
    """The placeholder address of node `index` (0-based) until Slurm names the node."""
    return f"{PLACEHOLDER_PREFIX}{index // 250}.{index % 250 + 1}"


def node_host_name(index: int) -> str:
    """The topology's name for the allocation's node `index`: node0, node1, ..."""
    return f"node{index}"


class Slurm(Strict):
    """What pdkit asks Slurm for (`launcher: slurm`): one allocation for the whole deployment,
    each process a job step on its node."""

    nodes: int = Field(ge=1, description="Nodes of the allocation (sbatch --nodes).")
    gpus_per_node: int = Field(
        ge=0,
        description="GPUs per node (sbatch --gpus-per-node; 0: none asked). Placement puts "
        "instances on them as on a host's `gpus`.",
    )
    gpu_type: str | None = Field(
        None,
        description="GPU model of the nodes, e.g. H100-SXM (kit/perf's model; the sim engine "
        "times itself by it).",
    )
    partition: str | None = Field(
        None, description="sbatch --partition; default: the cluster's default partition."
    )
    account: str | None = Field(None, description="sbatch --account; default: the user's.")
    time_limit: str = Field(
        "01:00:00",
        description="sbatch --time (e.g. 30, 04:00:00, 1-00:00:00). When Slurm ends the job at "
        "this limit, `pdkit status` says so.",
    )
    nodelist: tuple[str, ...] = Field(
        (),
        description="sbatch --nodelist: run on exactly these nodes (as many as `nodes`).",
    )
    constraint: str | None = Field(
        None, description="sbatch --constraint: node features, e.g. `h100&ib`."
    )
    container_image: str | None = Field(
        None,
        description="Sites with pyxis/enroot: every step runs in this image (srun "
        "--container-image); the image holds pdkit and SGLang.",
    )
    venv: str | None = Field(
        None,
        description="The Python environment on the nodes (a virtualenv on a shared file "
        "system) with pdkit and, for engine sglang, SGLang; its bin/ goes first on the steps' "
        "PATH. Default: the venv pdkit runs from (clusters whose nodes see it). Provisioning "
        "it is the site's business: `pdkit provision --check` says what is missing.",
    )
    root: str = Field(
        ".pdkit/slurm",
        description="A folder on a file system every node and the control machine share: "
        "each node's root prefix (<root>/node0, ...: logs, caches) and the job's files (the "
        "batch script, its output, the nodes it got). Relative: from the topology's folder.",
    )
    network_interface: str | None = Field(
        None,
        description="The nodes' interface that carries their address (e.g. eth0, ib0): "
        "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME of multi-node instances, which need it.",
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="What the workers compute on, as a host's `device`: `cpu` for nodes "
        "without GPUs (set gpus_per_node: 0), e.g. the real SGLang on the CPU on a test cluster.",
    )
    sglang_python: str | None = Field(
        None,
        description="Interpreter of engine sglang's workers on the nodes, as a host's "
        "`sglang_python`, when SGLang lives in a venv of its own beside `venv` (which holds "
        "pdkit for the router). Relative: from the topology's folder.",
    )

    @model_validator(mode="after")
    def _nodelist_covers_nodes(self) -> Slurm:
        if self.nodelist and len(self.nodelist) != self.nodes:
            raise ValueError(
                f"nodelist: names {len(self.nodelist)} node(s) but nodes is {self.nodes}; "
                "list exactly `nodes` nodes, or leave nodelist out"
            )
        return self

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not re.fullmatch(TIME_LIMIT_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a Slurm time; write minutes (30), HH:MM:SS (04:00:00) or "
                "D-HH:MM:SS (1-00:00:00)"
            )
        return value

    sbatch_args: tuple[str, ...] = Field(
        (),
        description="More sbatch options, as written on its command line "
        "(e.g. [--exclusive, --qos=high]).",
    )


def stand_in_hosts(data: Any) -> Any:
    """The topology's raw mapping with `hosts:` standing in for the allocation's nodes, when it
    says `launcher: slurm` and gives a usable `slurm:` (a new mapping; `data` is unchanged).
    Anything else is returned as it is, for the schema to report."""
    if not isinstance(data, dict) or data.get("launcher") != "slurm":
        return data
    raw = data.get("slurm")
    if "hosts" in data or not isinstance(raw, dict):
        return data
    nodes, gpus = raw.get("nodes"), raw.get("gpus_per_node")
    if not isinstance(nodes, int) or not isinstance(gpus, int) or nodes < 1 or gpus < 0:
        # `slurm:` itself is reported; one stand-in host keeps `hosts:` out of the report.
        nodes, gpus = 1, 0
    root = str(raw.get("root", ".pdkit/slurm"))
    hosts = []
    for index in range(nodes):
        host: dict[str, Any] = {
            "name": node_host_name(index),
            "address": placeholder_address(index),
            "connection": "local",
            "gpus": gpus,
            "service_manager": "supervisord",
            "root": f"{root.rstrip('/')}/{node_host_name(index)}",
        }
        if raw.get("gpu_type") is not None:
            host["gpu_type"] = raw["gpu_type"]
        for key in ("network_interface", "device", "sglang_python"):
            if raw.get(key) is not None:
                host[key] = raw[key]
        hosts.append(host)
    return {**data, "hosts": hosts}
