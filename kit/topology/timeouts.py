"""SGLang's PD handoff timeouts (`transfer.timeouts`): the variables they render as, what is in
force for a role once its `env:` has had its say, and the longest a request may wait in the
handoff, which the router's own timeouts follow. Pure.

SGLang 0.5.23 reads them in `srt/disaggregation/common/conn.py` (`envs.*` from
`srt/environ.py`): the prefill gives up on a request whose decode has not reserved KV room
after BOOTSTRAP_TIMEOUT s, the decode on one whose KV has not arrived WAITING_TIMEOUT s after
reserving (with `--disaggregation-decode-allocation-policy prefill_complete` the prefill waits
both), and the decode pings every prefill's bootstrap server every HEARTBEAT_INTERVAL s (at
least 2) and counts it offline after HEARTBEAT_MAX_FAILURE misses (at least 1).
"""

from __future__ import annotations

from collections.abc import Iterator

from kit.errors import Problem
from kit.topology.schema import ROLE_NAMES, PDTimeouts, RoleSpec, Topology

PD_TIMEOUT_ENV: dict[str, str] = {
    "bootstrap_timeout_s": "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "waiting_timeout_s": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "heartbeat_interval_s": "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    "heartbeat_max_failures": "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
}
"""`transfer.timeouts` field -> the SGLang variable it renders as."""
# SGLang parses these with int() (EnvInt); the interval with float() (EnvFloat).
_INTEGER_FIELDS = {"bootstrap_timeout_s", "waiting_timeout_s", "heartbeat_max_failures"}


def user_env(topology: Topology, role: str) -> dict[str, str]:
    """The user's env for a role: transfer.env < defaults.env < role.env."""
    spec: RoleSpec = getattr(topology, role)
    return {**topology.transfer.env, **topology.defaults.env, **spec.env}


def topology_timeouts(topology: Topology) -> PDTimeouts:
    """`transfer.timeouts`, with `cluster:`'s heartbeat failures (its key, else its profile's)
    where `transfer.timeouts` does not set them."""
    timeouts = topology.transfer.timeouts
    cluster = topology.cluster
    failures = cluster.heartbeat_max_failures or cluster.defaults.heartbeat_max_failures
    if failures is None or "heartbeat_max_failures" in timeouts.model_fields_set:
        return timeouts
    return timeouts.model_copy(update={"heartbeat_max_failures": failures})


def timeouts_env(timeouts: PDTimeouts) -> dict[str, str]:
    """The SGLang variables for `timeouts` (every one, so that a worker's env file says what
    is in force)."""
    return {name: f"{getattr(timeouts, key):g}" for key, name in PD_TIMEOUT_ENV.items()}


def role_timeouts(topology: Topology, role: str) -> PDTimeouts:
    """The timeouts in force for `role`: `transfer.timeouts`, then any the role's env sets
    (a value that does not parse is left to `env_problems` and ignored here)."""
    env = user_env(topology, role)
    values = topology_timeouts(topology).model_dump()
    for key, name in PD_TIMEOUT_ENV.items():
        if name in env and (parsed := _parse(key, env[name])) is not None:
            values[key] = parsed
    return PDTimeouts.model_construct(**values)


def handoff_limit_s(topology: Topology) -> float:
    """The longest (s) a request may wait in the PD handoff before a worker fails it: the
    prefill's bootstrap timeout plus the decode's waiting timeout."""
    prefill = role_timeouts(topology, "prefill").bootstrap_timeout_s
    decode = role_timeouts(topology, "decode").waiting_timeout_s
    return float(prefill + decode)


def env_problems(topology: Topology) -> Iterator[Problem]:
    """A PD timeout variable set in an `env:` to something SGLang cannot parse (it would stop
    at start-up); each names the key and `transfer.timeouts`, the place to set it."""
    sections: list[tuple[tuple[str, ...], dict[str, str]]] = [
        (("transfer", "env"), topology.transfer.env),
        (("defaults", "env"), topology.defaults.env),
    ]
    sections += [((role, "env"), getattr(topology, role).env) for role in ROLE_NAMES]
    for where, env in sections:
        for key, name in PD_TIMEOUT_ENV.items():
            if name in env and _parse(key, env[name]) is None:
                kind = "a whole number" if key in _INTEGER_FIELDS else "a number"
                yield Problem(
                    (*where, name),
                    f"{name} is '{env[name]}', not {kind}: SGLang would stop at start-up.",
                    f"set transfer.timeouts.{key} instead (the router's timeouts follow it).",
                )


def _parse(key: str, text: str) -> float | None:
    try:
        return int(text) if key in _INTEGER_FIELDS else float(text)
    except ValueError:
        return None
