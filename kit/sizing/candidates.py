"""The deployments `pdkit size` considers: how one instance of a role is launched
(`RoleOption`), how many of each (`Group`), colocated or prefill + decode (`Deployment`).

Role options are the parallelism SGLang can run the model with on these hosts: TP sizes that are
powers of two up to a host's GPUs (whole hosts, only when the model fits on no single host),
that divide the model's attention heads, and whose weights leave room for KV; for MoE models
also DP attention (dp = tp, attention TP 1) with the experts spread over the same GPUs (ep =
tp). Decode options may cap `--max-running-requests`, colocated ones lower
`--chunked-prefill-size`; both are found by the search (`kit.sizing.capacity`,
`kit.sizing.search`), not guessed here. Whether prefill and decode options go together, and
whether a deployment fits on the hosts, is the validator's call
(`kit.sizing.accept`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from kit.perf.cluster import Cluster, InstanceConfig, Instances
from kit.sizing.problem import LaunchKnobs, SizingProblem
from kit.topology.launch import Parallelism, WorkerLaunch

Role = Literal["prefill", "decode", "colocated"]
Kind = Literal["pd", "colocated"]


@dataclass(frozen=True)
class RoleOption:
    """How one instance is launched: parallelism and the knobs the search sets (None: SGLang's
    default)."""

    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    ep: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None

    @property
    def parallelism(self) -> Parallelism:
        """The option's parallelism (sizing searches no pipeline stages: pp 1)."""
        return Parallelism(tp=self.tp, dp=self.dp, dp_attention=self.dp_attention, ep=self.ep)

    @property
    def gpus(self) -> int:
        return self.parallelism.gpus

    @property
    def attn_tp(self) -> int:
        return self.parallelism.attn_tp

    def describe(self) -> str:
        """'tp2', 'tp8 dp8 dp-attention ep8', 'tp1 chunk 2048', 'tp2 max-running 128'."""
        text = f"tp{self.tp}"
        if self.dp_attention:
            text += f" dp{self.dp} dp-attention"
        if self.ep > 1:
            text += f" ep{self.ep}"
        if self.chunked_prefill_size:
            text += f" chunk {self.chunked_prefill_size}"
        if self.max_running_requests:
            text += f" max-running {self.max_running_requests}"
        return text


@dataclass(frozen=True)
class Group:
    """`count` instances of one option."""

    option: RoleOption
    count: int

    @property
    def gpus(self) -> int:
        return self.option.gpus * self.count


@dataclass(frozen=True)
class Deployment:
    """Colocated instances, or prefill and decode instances."""

    prefill: Group | None = None
    decode: Group | None = None
    colocated: Group | None = None

    @property
    def kind(self) -> Kind:
        return "colocated" if self.colocated is not None else "pd"

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(g for g in (self.prefill, self.decode, self.colocated) if g is not None)

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def instances(self) -> int:
        return sum(g.count for g in self.groups)

    def times(self, copies: int) -> Deployment:
        """`copies` of this deployment side by side, as one."""
        return Deployment(
            *(None if g is None else Group(g.option, g.count * copies) for g in self._slots())
        )

    def _slots(self) -> tuple[Group | None, Group | None, Group | None]:
        return self.prefill, self.decode, self.colocated

    def shape(self) -> str:
        """'2P1D' or '3 colocated'."""
        if self.colocated is not None:
            return f"{self.colocated.count} colocated"
        assert self.prefill is not None and self.decode is not None
        return f"{self.prefill.count}P{self.decode.count}D"

    def launch(self) -> str:
        """'P tp1, D tp2 max-running 128' or 'tp2 chunk 2048'."""
        if self.colocated is not None:
            return self.colocated.option.describe()
        assert self.prefill is not None and self.decode is not None
        return f"P {self.prefill.option.describe()}, D {self.decode.option.describe()}"

    def label(self) -> str:
        """'2P1D (P tp1, D tp2)' or '3 colocated (tp1)'."""
        return f"{self.shape()} ({self.launch()})"

    def cluster(self, problem: SizingProblem) -> Cluster:
        """The deployment in `kit.perf`'s cluster model."""
        if self.colocated is not None:
            return Cluster(colocated=_instances(problem, self.colocated, "colocated"))
        assert self.prefill is not None and self.decode is not None
        return Cluster(
            prefill=_instances(problem, self.prefill, "prefill"),
            decode=_instances(problem, self.decode, "decode"),
            rdma=problem.rdma,
        )


def _instances(problem: SizingProblem, group: Group, role: Role) -> Instances:
    return Instances(instance_config(problem, group.option, role), group.count)


def instance_config(problem: SizingProblem, option: RoleOption, role: Role) -> InstanceConfig:
    """One instance of `option` in `role` as the performance model runs it."""
    return InstanceConfig.from_launch(
        launch(problem, option, role),
        model=problem.model,
        gpu=problem.gpu,
        efficiency=problem.efficiency,
    )


def launch(problem: SizingProblem, option: RoleOption, role: Role) -> WorkerLaunch:
    """The launch record of one instance of `option` in `role`: the option's parallelism and
    knobs, the base topology's other launch values, whole hosts when it spans several."""
    knobs = problem.knobs.get(role) or LaunchKnobs()
    per_host = problem.gpus_per_host
    return WorkerLaunch(
        model_path=problem.model.name,
        gpu_type=problem.gpu.name,
        parallelism=option.parallelism,
        nnodes=max(1, option.gpus // per_host) if option.gpus > per_host else 1,
        page_size=knobs.page_size,
        kv_cache_dtype=knobs.kv_cache_dtype,
        mem_fraction_static=knobs.mem_fraction_static,
        max_running_requests=option.max_running_requests,
        chunked_prefill_size=option.chunked_prefill_size,
        num_reserved_decode_tokens=knobs.num_reserved_decode_tokens,
    )


def tp_sizes(problem: SizingProblem) -> tuple[list[int], list[int]]:
    """TP sizes the hosts can hold: powers of two up to the largest host, and whole hosts (2,
    4, ... of them, while there are that many hosts of that size)."""
    per_host = problem.gpus_per_host
    one_host = []
    tp = 1
    while tp <= min(per_host, problem.gpus):
        one_host.append(tp)
        tp *= 2
    full = sum(1 for h in problem.base["hosts"] if int(h.get("gpus", 0)) == per_host)
    spanning = []
    nodes = 2
    while nodes <= full:
        spanning.append(per_host * nodes)
        nodes *= 2
    return one_host, spanning


def heads_allow(problem: SizingProblem, option: RoleOption) -> bool:
    """SGLang shards attention heads, KV heads and experts evenly or not at all: the attention
    TP must divide the heads, divide or be a multiple of the KV heads, and the EP size the
    experts."""
    model = problem.model
    attn_tp = option.attn_tp
    if model.heads % attn_tp:
        return False
    if not model.is_mla and model.kv_heads % attn_tp and attn_tp % model.kv_heads:
        return False
    return not (option.ep > 1 and model.experts % option.ep)


def fits(problem: SizingProblem, option: RoleOption, role: Role) -> bool:
    """The weights leave room for KV on the option's GPUs."""
    return instance_config(problem, option, role).fits()


def base_options(problem: SizingProblem, role: Role) -> list[RoleOption]:
    """Every parallelism the model can run with in `role` on the hosts (see the module doc),
    fewest GPUs first, before the search tunes any knob. Instances span hosts only when the
    model fits on no single host: across hosts TP pays the network on every layer."""
    one_host, spanning = tp_sizes(problem)
    options = _shapes(problem, role, one_host)
    return options or _shapes(problem, role, spanning)


def _shapes(problem: SizingProblem, role: Role, sizes: list[int]) -> list[RoleOption]:
    options = []
    for tp in sizes:
        shapes = [RoleOption(tp=tp)]
        if problem.model.is_moe and tp > 1:
            shapes.append(RoleOption(tp=tp, dp=tp, dp_attention=True, ep=tp))
        options += [o for o in shapes if heads_allow(problem, o) and fits(problem, o, role)]
    return options


def with_knobs(
    option: RoleOption, *, chunk: int | None = None, max_running: int | None = None
) -> RoleOption:
    return replace(option, chunked_prefill_size=chunk, max_running_requests=max_running)
