"""SGLang-specific checks: user flags against SGLang's parser catalog for the pinned version,
flags pdkit owns, settings prefill and decode must agree on, and parallelism the transfer
backend cannot map.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kit.errors import Problem
from kit.sglang.catalog import Catalog
from kit.sglang.hicache import POOL_FLAGS
from kit.sglang.render import role_args
from kit.sglang.startup import check as startup_problems
from kit.topology.args import normalize_flag
from kit.topology.schema import ROLE_NAMES, ArgValue, RoleSpec, Topology

OWNED_FLAGS: dict[str, str] = {
    "model-path": "model.path",
    "served-model-name": "model.served_name",
    "revision": "model.revision",
    "trust-remote-code": "model.trust_remote_code",
    "tokenizer-path": "model.path",
    "host": "<role>.bind",
    "port": "<role>.port",
    "disaggregation-mode": "the role section (prefill: or decode:)",
    "disaggregation-bootstrap-port": "prefill.bootstrap_port",
    "disaggregation-transfer-backend": "transfer.backend",
    "disaggregation-ib-device": "transfer.ib_devices or the hosts' gpu_nics",
    "tp-size": "<role>.tp",
    "dp-size": "<role>.dp",
    "pp-size": "<role>.pp",
    "ep-size": "<role>.ep",
    "enable-dp-attention": "<role>.dp_attention",
    "attn-dp-size": "<role>.dp with <role>.dp_attention: true",
    "nnodes": "the hosts' GPU counts (pdkit spans hosts when an instance needs it)",
    "node-rank": "placement (pdkit assigns node ranks)",
    "dist-init-addr": "<role>.dist_init_port",
    "base-gpu-id": "placement (pdkit assigns GPUs)",
    "device": "hosts[].device (cpu or cuda)",
    "nccl-port": "<role>.nccl_port (pdkit plans it with every other port)",
    "api-key": "router.api_key_env (workers are reached only through the router)",
    "admin-api-key": "router.api_key_env",
    "kv-events-config": "<role>.kv_events (pdkit renders the publisher and its ports)",
}
"""Flags pdkit sets from the topology -> the key to set instead."""

AGREED_FLAGS = (
    "page-size",
    "kv-cache-dtype",
    "disaggregation-decode-allocation-policy",
    "disaggregation-enable-kv-checksum",
)
"""Must be equal on prefill and decode, else the first request fails at KV transfer."""


def check(topology: Topology, catalog: Catalog) -> list[Problem]:
    """Every SGLang-level problem of the topology."""
    problems = list(_flags(topology, catalog))
    problems += _agreement(topology, catalog)
    problems += _parallelism(topology, catalog)
    problems += _kv_events(topology)
    problems += startup_problems(topology, catalog)  # values SGLang refuses when it starts
    return problems


def _flags(topology: Topology, catalog: Catalog) -> Iterator[Problem]:
    scopes: list[tuple[str, dict[str, ArgValue]]] = [("defaults", topology.defaults.args)]
    scopes += [(role, getattr(topology, role).args) for role in ROLE_NAMES]
    owned = {**OWNED_FLAGS, **POOL_FLAGS} if topology.kv_pool is not None else OWNED_FLAGS
    for scope, args in scopes:
        for key, value in args.items():
            yield from _flag(catalog, scope, key, value, owned)


def _flag(
    catalog: Catalog, scope: str, key: str, value: ArgValue, owned: dict[str, str]
) -> Iterator[Problem]:
    path = (scope, "args", key)
    name = normalize_flag(key)
    spec = catalog.lookup(name)
    owner = owned.get(name) or (owned.get(normalize_flag(spec.flag)) if spec else None)
    if owner:
        role = scope if scope != "defaults" else "prefill/decode"
        yield Problem(
            path,
            f"--{name} is set by pdkit.",
            f"set {owner.replace('<role>', role)} instead, and remove it from args.",
        )
        return
    if spec is None:
        close = catalog.suggest(name)
        hint = (
            f"did you mean {close}?" if close else "check `python -m sglang.launch_server --help`."
        )
        yield Problem(path, f"--{name} is not a flag of SGLang {catalog.version}.", hint)
        return
    if value is None:
        return
    error = catalog.check_value(spec, value)
    if error:
        yield Problem(path, f"{spec.flag} {error}.", "fix the value.")


def deprecations(topology: Topology, catalog: Catalog) -> list[Problem]:
    """A warning for each flag of a topology's args that SGLang `catalog.version` deprecates,
    naming SGLang's replacement (its help text's). Not errors: SGLang still takes them, until
    it removes them (`pdkit validate --strict` refuses them)."""
    warnings: list[Problem] = []
    scopes: list[tuple[str, dict[str, ArgValue]]] = [("defaults", topology.defaults.args)]
    scopes += [(role, getattr(topology, role).args) for role in ROLE_NAMES]
    for scope, args in scopes:
        for key, value in args.items():
            spec = catalog.lookup(key)
            if spec is None or not spec.deprecated or value is None or value is False:
                continue
            if normalize_flag(spec.flag) in OWNED_FLAGS:
                continue  # refused as owned, with the key to set
            use = spec.replacement
            warnings.append(
                Problem(
                    (scope, "args", key),
                    f"{spec.flag} is deprecated in SGLang {catalog.version} and will be removed"
                    + (f"; SGLang says to use {use}" if use else "")
                    + ".",
                    f"replace {key} with {_as_args(use)} in args." if use else "remove it.",
                )
            )
    return warnings


def _as_args(replacement: str) -> str:
    """SGLang's replacement as `args` keys: "--smg-grpc-mode" -> "smg-grpc-mode: true",
    "--x-{a,b}=v" -> "x-a: v and x-b: v"; a spelling with a placeholder stays as SGLang wrote
    it."""
    match = re.fullmatch(r"--([\w-]*)(?:\{([\w,]+)\})?([\w-]*)(?:=(\S+))?", replacement)
    if match is None:
        return replacement
    head, group, tail, value = match.groups()
    names = [f"{head}{part}{tail}" for part in group.split(",")] if group else [head + tail]
    return " and ".join(f"{name}: {value or 'true'}" for name in names)


def _kv_events(topology: Topology) -> Iterator[Problem]:
    """KV events need a radix cache to publish from; the router's `cache_aware` needs them on
    the prefills."""
    for role in ROLE_NAMES:
        spec: RoleSpec = getattr(topology, role)
        if spec.kv_events is None:
            continue
        args = role_args(topology, role)
        if args.get("disable-radix-cache"):
            yield Problem(
                (role, "kv_events"),
                f"{role} has --disable-radix-cache: there is no cache to publish events from.",
                f"remove disable-radix-cache from args, or remove {role}.kv_events.",
            )
        elif role == "decode" and not args.get("disaggregation-decode-enable-radix-cache"):
            yield Problem(
                ("decode", "kv_events"),
                "a PD decode runs without a radix cache unless "
                "--disaggregation-decode-enable-radix-cache is set, so it would publish nothing.",
                "add disaggregation-decode-enable-radix-cache: true to decode.args, or remove "
                "decode.kv_events.",
            )
    router = topology.router
    cache_aware = router.kind == "pdkit" and router.prefill_policy == "cache_aware"
    if cache_aware and topology.prefill.kv_events is None:
        yield Problem(
            ("router", "prefill_policy"),
            "cache_aware routes by the prefills' KV events, and the prefills publish none.",
            "add `kv_events: {}` under prefill:, or use prefill_policy: prefix_affinity.",
        )


def effective(topology: Topology, catalog: Catalog, role: str, flag: str) -> object:
    """The value a role ends up with for `flag`: its args, else SGLang's default."""
    args = role_args(topology, role)
    if flag in args:
        return args[flag]
    spec = catalog.lookup(flag)
    return spec.default if spec else None


def _agreement(topology: Topology, catalog: Catalog) -> Iterator[Problem]:
    for flag in AGREED_FLAGS:
        prefill = effective(topology, catalog, "prefill", flag)
        decode = effective(topology, catalog, "decode", flag)
        if _same(prefill, decode):
            continue
        where = "decode" if flag in {normalize_flag(k) for k in topology.decode.args} else "prefill"
        yield Problem(
            (where, "args", flag),
            f"prefill has --{flag} {_show(prefill)} but decode has {_show(decode)}; "
            "KV transfer fails on the first request when they differ.",
            f"set {flag} once under defaults.args so both roles share it.",
        )


def _same(a: object, b: object) -> bool:
    return _show(a) == _show(b)


def _show(value: object) -> str:
    if value is None or value is False:
        return "unset"
    if value is True:
        return "on"
    return str(value)


def _parallelism(topology: Topology, catalog: Catalog) -> Iterator[Problem]:
    """Prefill/decode parallelism SGLang 0.5.23's PD transfer cannot map. Its decode checks a
    prefill only on the first request (disaggregation/common/conn.py) and an uncaught error
    there takes the decode scheduler down, so pdkit refuses these before launch."""
    prefill: RoleSpec = topology.prefill
    decode: RoleSpec = topology.decode
    for role, spec in (("prefill", prefill), ("decode", decode)):
        if spec.dp_attention and spec.tp % spec.dp:
            yield Problem(
                (role, "dp"),
                f"with dp_attention, tp ({spec.tp}) must be a multiple of dp ({spec.dp}).",
                "pick a dp that divides tp.",
            )
        if spec.ep > 1 and spec.tp % spec.ep:
            yield Problem(
                (role, "ep"), f"ep ({spec.ep}) must divide tp ({spec.tp}).", "pick ep dividing tp."
            )
    p_attn, d_attn = prefill.parallelism.attn_tp, decode.parallelism.attn_tp
    if p_attn and d_attn and max(p_attn, d_attn) % min(p_attn, d_attn):
        # _resolve_rank_mapping divides one size by the other; a remainder leaves ranks unmapped.
        yield Problem(
            ("decode", "tp"),
            f"prefill attention-TP {p_attn} and decode attention-TP {d_attn} do not divide one "
            "another, so the transfer backend cannot map decode ranks to prefill ranks.",
            "make one attention-TP size (tp, or tp/dp with dp_attention) a multiple of the other.",
        )
    if decode.pp not in (1, prefill.pp):
        yield Problem(
            ("decode", "pp"),
            f"decode pp ({decode.pp}) must be 1 or equal to prefill pp ({prefill.pp}).",
            "set decode.pp: 1.",
        )
    decode_cp = effective(topology, catalog, "decode", "attn-cp-size")
    if decode_cp not in (None, 1, "1"):
        yield Problem(
            ("decode", "args", "attn-cp-size"),
            "decode instances must run attn-cp-size 1 in disaggregation mode.",
            "remove attn-cp-size from decode args.",
        )
    policy = effective(topology, catalog, "decode", "disaggregation-decode-allocation-policy")
    if policy == "prefill_complete":
        if topology.transfer.backend not in ("mooncake", "mooncake_tcp"):
            yield Problem(
                ("transfer", "backend"),
                "the prefill_complete allocation policy works only with Mooncake.",
                "use transfer.backend: mooncake, or another allocation policy.",
            )
        for role, spec in (("prefill", prefill), ("decode", decode)):
            attn_tp = spec.parallelism.attn_tp
            if attn_tp != 1 or spec.pp != 1:
                yield Problem(
                    (role, "tp"),
                    f"the prefill_complete allocation policy needs attention-TP 1 and pp 1 on "
                    f"both roles; {role} has attention-TP {attn_tp}, pp {spec.pp}.",
                    "set tp: 1 and pp: 1 on both roles, or use the default allocation policy "
                    "(early).",
                )


__all__ = ["AGREED_FLAGS", "OWNED_FLAGS", "check", "deprecations", "effective"]
