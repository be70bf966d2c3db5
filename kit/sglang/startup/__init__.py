"""Values SGLang accepts on the command line but refuses when the server starts.

SGLang's parser (the catalog, kit/sglang/catalog.py) checks types and choices only. Its start-up
hooks (`sglang/srt/arg_groups/*_hook.py`, run by `ServerArgs.resolve_once()` and
`check_server_args()` when `launch_server` starts) refuse more: a negative
`schedule-conservativeness`, a `chunked-prefill-size` that is not a multiple of `page-size`,
`enable-response-store` on a PD server. Deployed, such a server exits after the hosts are set
up. Each `StartupRule` (rules.py) is one of those refusals, with SGLang's own message, the
file:line that raises it and the fix, in one table per SGLang version (v0_5_23.py); `check`
applies the pinned version's table to the values each role's servers start with and points
each problem at the key that set the value.

The tables hold the checks that read only flags and pdkit's own parallelism, not those that
need the GPU, the model's config or the installed kernels.
tests/e2e/sglang/test_sglang_startup_rules.py runs SGLang's own hooks on a bad and a good value of
every rule, so a table cannot drift from SGLang.
"""

from __future__ import annotations

from kit.errors import Problem
from kit.sglang.catalog import Catalog
from kit.sglang.hicache import POOL_KEYS, pool_args
from kit.sglang.startup import v0_5_22, v0_5_23
from kit.sglang.startup.rules import LaunchValues, StartupRule
from kit.topology.args import normalize_flag
from kit.topology.schema import ROLE_NAMES, ArgValue, RoleSpec, Topology

KeyPath = tuple[str | int, ...]

STARTUP_RULES: dict[str, tuple[StartupRule, ...]] = {
    "0.5.22": v0_5_22.RULES,
    "0.5.23": v0_5_23.RULES,
}
"""SGLang version -> the values that version refuses at start. A version without a table gets
no start-up checks (its flags are still checked against its catalog)."""


def _canonical(catalog: Catalog, key: str) -> str:
    """'decode_context_parallel_size' -> 'dcp-size': the flag's canonical name, no dashes."""
    spec = catalog.lookup(key)
    return normalize_flag(spec.flag) if spec else normalize_flag(key)


def launch_values(
    topology: Topology, catalog: Catalog, role: str
) -> tuple[LaunchValues, dict[str, KeyPath]]:
    """What `role`'s servers start with, and for each flag the topology key that sets it:
    defaults.args < the role's args, then the flags pdkit sets (kit/sglang/render.py)."""
    spec: RoleSpec = getattr(topology, role)
    values: dict[str, object] = {}
    keys: dict[str, KeyPath] = {}
    for scope, args in (("defaults", topology.defaults.args), (role, spec.args)):
        for name, value in args.items():
            flag = _canonical(catalog, name)
            values[flag] = value
            keys[flag] = (scope, "args", name)
    backend = topology.transfer.backend
    model = topology.model
    owned: dict[str, tuple[ArgValue, KeyPath]] = {
        "disaggregation-mode": (role, (role,)),
        # SGLang treats mooncake_tcp as mooncake with TCP forced (pd_disaggregation_hook.py:30).
        "disaggregation-transfer-backend": (
            "mooncake" if backend == "mooncake_tcp" else backend,
            ("transfer", "backend"),
        ),
        "tp-size": (spec.tp, (role, "tp")),
        # As render.py spells it: attention DP is --attn-dp-size, --dp-size counts replicas.
        "dp-size": (1 if spec.dp_attention else spec.dp, (role, "dp")),
        "attn-dp-size": (spec.dp if spec.dp_attention else 1, (role, "dp")),
        "pp-size": (spec.pp, (role, "pp")),
        "ep-size": (spec.ep, (role, "ep")),
        "served-model-name": (
            model.served_name or model.path,
            ("model", "served_name") if model.served_name else ("model", "path"),
        ),
    }
    for flag, value in pool_args(topology, role).items():
        owned[flag] = (value, ("kv_pool", *POOL_KEYS.get(flag, ())))
    for flag, (value, key) in owned.items():
        values[flag] = value
        keys[flag] = key
    return LaunchValues(role, values, catalog), keys


def check(topology: Topology, catalog: Catalog) -> list[Problem]:
    """A problem for each value the topology's SGLang servers would refuse when they start.

    At most one per key and role, the first SGLang would report; a key under `defaults.args`
    that both roles refuse gets one problem naming both."""
    rules = STARTUP_RULES.get(catalog.version, ())
    found: dict[tuple[KeyPath, str], tuple[StartupRule, str, list[str]]] = {}
    for role in ROLE_NAMES:
        values, keys = launch_values(topology, catalog, role)
        refused: set[KeyPath] = set()
        for rule in rules:
            key = keys.get(rule.flag)
            if key is None or key in refused or role not in rule.modes:
                continue
            if not values.given(rule.flag) or not rule.refuses(values):
                continue
            refused.add(key)
            entry = found.setdefault((key, rule.name), (rule, rule.message(values), []))
            entry[2].append(role)
    problems = []
    for (key, _), (rule, says, roles) in found.items():
        where = f" on {' and '.join(roles)}" if key[0] == "defaults" else ""
        message = f"SGLang {catalog.version} refuses this when the server starts{where}: {says}"
        problems.append(Problem(key, message, rule.fix))
    return problems


__all__ = ["STARTUP_RULES", "LaunchValues", "StartupRule", "check", "launch_values"]
