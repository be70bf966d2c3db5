"""Each instance's launch record (`WorkerLaunch`) from the topology: the role's parallelism,
its hosts' GPU type and the launch values of its merged `args` (pdkit defaults <
defaults.args < the role's args), the same values kit.sglang renders into its argv. Pure.

Call after validation: SGLang's catalog has checked each value's type by then.
"""

from __future__ import annotations

import re

from kit.errors import Problem
from kit.sglang.render import host_args, role_env
from kit.topology.launch import WorkerLaunch
from kit.topology.place import InstancePlacement
from kit.topology.schema import ROLE_NAMES, ArgValue, RoleSpec, Topology
from kit.topology.sim_env import SIM_GPU_ENV, SPEED_ENV, SettingsError, speed_from_env

# sglang.srt.utils.common.human_readable_int: 32k = 32000, 32Ki = 32768.
_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIXES |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")


def _integer(value: ArgValue) -> int | None:
    """An integer flag value (suffixes as SGLang's human_readable_int), None when unset."""
    if value is None or isinstance(value, bool | list):
        return None
    if isinstance(value, int | float):
        return int(value)
    match = _HUMAN_INT.fullmatch(value.strip())
    if match is None:
        return None  # the catalog check reports it
    number, suffix = match.groups()
    return int(float(number) * _SUFFIXES[suffix]) if suffix else int(number)


def _number(value: ArgValue) -> float | None:
    if value is None or isinstance(value, bool | list):
        return None
    try:
        return float(value)
    except ValueError:
        return None  # the catalog check reports it


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def worker_launch(topology: Topology, p: InstancePlacement) -> WorkerLaunch:
    """The launch record of instance `p` (its rank-0 host's GPU type)."""
    spec: RoleSpec = getattr(topology, p.role)
    host = topology.host(p.nodes[0].host)
    args = host_args(topology, p.role, host)
    env = role_env(topology, p.role)
    gpu_type = host.gpu_type
    speed = 1.0
    if topology.engine == "sim":
        gpu_type = env.get(SIM_GPU_ENV) or gpu_type
        speed = speed_from_env(env)
    dtype = args.get("kv-cache-dtype")
    return WorkerLaunch(
        model_path=topology.model.path,
        device=host.device,
        gpu_type=gpu_type,
        parallelism=spec.parallelism,
        nnodes=p.nnodes,
        page_size=_integer(args.get("page-size")),
        kv_cache_dtype=str(dtype) if dtype not in (None, True, False) else "auto",
        mem_fraction_static=_number(args.get("mem-fraction-static")),
        max_running_requests=_integer(args.get("max-running-requests")),
        max_total_tokens=_integer(args.get("max-total-tokens")),
        max_prefill_tokens=_integer(args.get("max-prefill-tokens")),
        chunked_prefill_size=_integer(args.get("chunked-prefill-size")),
        context_length=_integer(args.get("context-length")),
        enable_mixed_chunk=args.get("enable-mixed-chunk") is True,
        moe_a2a_backend=_text(args.get("moe-a2a-backend")),
        num_reserved_decode_tokens=_integer(args.get("num-reserved-decode-tokens")),
        disaggregation_decode_extra_slots=_integer(args.get("disaggregation-decode-extra-slots")),
        speed=speed,
    )


def launch_problems(topology: Topology) -> list[Problem]:
    """Launch values the record cannot take: engine sim's PDKIT_SIM_SPEED must be a positive
    number (the sim refuses to start otherwise), located where the role's value is set."""
    if topology.engine != "sim":
        return []
    problems = []
    for role in ROLE_NAMES:
        spec: RoleSpec = getattr(topology, role)
        try:
            speed_from_env(role_env(topology, role))
        except SettingsError as exc:
            scope: tuple[str | int, ...] = (role, "env")
            if SPEED_ENV not in spec.env:
                scope = (
                    ("defaults", "env")
                    if SPEED_ENV in topology.defaults.env
                    else ("transfer", "env")
                )
            problems.append(
                Problem(
                    (*scope, SPEED_ENV),
                    f"{exc}.",
                    "set a positive number (0.05: 20x slower than the GPUs).",
                )
            )
    return list({p.path: p for p in problems}.values())  # a shared value is reported once
