"""Every environment variable the sim engine reads, in one place.

Emulator-only knobs (``PDKIT_SIM_*``)
------------------------------------

=========================== ========== =====================================================
variable                    default    meaning
=========================== ========== =====================================================
``PDKIT_SIM_GPU``           H100-SXM   GPU the timing model emulates: A100-40G, A100-80G,
                                       H100-SXM, H200, B200, L40S (aliases such as ``H100``
                                       or ``A100`` are accepted). pdkit sets it from the
                                       host's ``gpu_type``.
``PDKIT_SIM_LOAD_SECONDS``  1.0        Wall seconds the emulated model takes to load; the
                                       worker answers 503 on ``/health`` meanwhile.
``PDKIT_SIM_SPEED``         1.0        Time scale: every modelled duration is divided by it
                                       (10 = ten times faster than the emulated GPU).
``PDKIT_SIM_SEED``          0          Seed of the emulated output tokens (``--random-seed``
                                       is used when this is unset).
``PDKIT_SIM_KV_SCALE``      1024       Divisor applied to the KV bytes a prefill writes to a
                                       decode over Mooncake, so a laptop keeps up (1 = the
                                       real volume).
``PDKIT_SIM_ANSWER_TOKENS`` 128        Mean answer length (tokens) of the emulated model when
                                       a request does not set ``ignore_eos``: it ends with
                                       EOS after a per-request length drawn uniformly from
                                       [mean/2, 3*mean/2]; 0 = never emit EOS.
``PDKIT_SIM_LOG_LEVEL``     info       Python log level name; unset: ``--log-level``.
``PDKIT_SIM_FAULT``         (none)     Make this worker's KV transfers fail the way a real
                                       one's do, each with the log line the real system
                                       writes (`kit.sim.faults`): ``refuse`` (the Mooncake
                                       connection is refused), ``hang`` (the KV never comes),
                                       ``corrupt`` (one byte flipped: wrong tokens, silently,
                                       unless both roles run with
                                       ``--disaggregation-enable-kv-checksum``).
=========================== ========== =====================================================

SGLang variables the sim honours with SGLang's meaning and defaults
------------------------------------------------------------------

``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s: a prefill request waits this long for its
decode to reserve KV room), ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` (300 s: a decode waits
this long for the KV after reserving), ``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`` (5 s, at
least 2), ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` (2), ``SGLANG_HEALTH_CHECK_TIMEOUT``
(20 s), ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` (true: ``/health`` runs a probe like
``/health_generate``), ``SGLANG_DISAGGREGATION_THREAD_POOL_SIZE`` (threads that run Mooncake
writes; default 4), ``SGLANG_HOST_IP`` (the address the transfer engine advertises; default
``--host``, or the primary address when that is a wildcard). ``MOONCAKE_PROTOCOL`` is
ignored for PD transfers: the sim always uses ``tcp``. Timeouts accept fractional seconds
(SGLang: integers). With ``--enable-hierarchical-cache --hicache-storage-backend mooncake``,
HiCache's ``MOONCAKE_MASTER``, ``MOONCAKE_TE_META_DATA_SERVER``, ``MOONCAKE_PROTOCOL``,
``MOONCAKE_DEVICE``, ``MOONCAKE_LOCAL_HOSTNAME`` and ``MOONCAKE_GLOBAL_SEGMENT_SIZE`` set up the
real Mooncake Store client of the prefix cache's L3 (kit/sim/prefix.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kit.perf.gpus import DEFAULT_GPU
from kit.sim.prefix import PoolSettings
from kit.topology.sim_env import SettingsError, env_integer, env_number, speed_from_env

# SGLang 0.5.23 defaults (sglang/srt/environ.py).
BOOTSTRAP_TIMEOUT_S = 300.0
WAITING_TIMEOUT_S = 300.0
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_MIN_INTERVAL_S = 2.0
HEARTBEAT_MAX_FAILURE = 2
HEALTH_CHECK_TIMEOUT_S = 20.0
TRANSFER_THREADS = 4
FAULTS = ("refuse", "hang", "corrupt")


@dataclass(frozen=True)
class SimSettings:
    """Resolved emulator settings; build with :meth:`from_env`."""

    gpu: str = DEFAULT_GPU
    load_seconds: float = 1.0
    speed: float = 1.0
    seed: int | None = None
    kv_scale: float = 1024.0
    answer_tokens: int = 128
    log_level: str | None = None
    bootstrap_timeout_s: float = BOOTSTRAP_TIMEOUT_S
    waiting_timeout_s: float = WAITING_TIMEOUT_S
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    heartbeat_max_failure: int = HEARTBEAT_MAX_FAILURE
    health_check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S
    health_generation: bool = True
    transfer_threads: int = TRANSFER_THREADS
    host_ip: str | None = None
    fault: str | None = None
    kv_pool: PoolSettings | None = None
    """The Mooncake Store client settings (MOONCAKE_*) HiCache's mooncake backend reads."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SimSettings:
        """Read the variables above from `env` (normally ``os.environ``).

        Raises `SettingsError` naming the variable when a value is malformed.
        """
        interval = env_number(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", HEARTBEAT_INTERVAL_S)
        level = env.get("PDKIT_SIM_LOG_LEVEL") or None
        if level is not None and not isinstance(logging.getLevelName(level.upper()), int):
            raise SettingsError(f"PDKIT_SIM_LOG_LEVEL={level!r} is not a log level name")
        seed = env.get("PDKIT_SIM_SEED")
        fault = (env.get("PDKIT_SIM_FAULT") or "").strip().lower() or None
        if fault is not None and fault not in FAULTS:
            raise SettingsError(
                f"PDKIT_SIM_FAULT={env['PDKIT_SIM_FAULT']!r} is not a fault; use one of "
                f"{', '.join(FAULTS)} (or leave it unset)"
            )
        host_ip = env.get("SGLANG_HOST_IP") or None
        try:
            pool = PoolSettings.from_env(dict(env), host_ip or "localhost")
        except ValueError as exc:
            raise SettingsError(f"MOONCAKE_GLOBAL_SEGMENT_SIZE: {exc}") from exc
        return cls(
            kv_pool=pool,
            gpu=env.get("PDKIT_SIM_GPU") or DEFAULT_GPU,
            load_seconds=env_number(env, "PDKIT_SIM_LOAD_SECONDS", 1.0, minimum=0.0),
            speed=speed_from_env(env),
            seed=env_integer(env, "PDKIT_SIM_SEED", 0) if seed else None,
            kv_scale=env_number(env, "PDKIT_SIM_KV_SCALE", 1024.0, minimum=1.0),
            answer_tokens=env_integer(env, "PDKIT_SIM_ANSWER_TOKENS", 128, minimum=0),
            log_level=level,
            bootstrap_timeout_s=env_number(
                env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", BOOTSTRAP_TIMEOUT_S, minimum=0.0
            ),
            waiting_timeout_s=env_number(
                env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", WAITING_TIMEOUT_S, minimum=0.0
            ),
            # SGLang clamps the interval to at least 2 s (disaggregation/common/conn.py).
            heartbeat_interval_s=max(HEARTBEAT_MIN_INTERVAL_S, interval),
            heartbeat_max_failure=env_integer(
                env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", HEARTBEAT_MAX_FAILURE, minimum=1
            ),
            health_check_timeout_s=env_number(
                env, "SGLANG_HEALTH_CHECK_TIMEOUT", HEALTH_CHECK_TIMEOUT_S, minimum=0.0
            ),
            health_generation=env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true")
            .strip()
            .lower()
            not in ("0", "false", "no", "off"),
            transfer_threads=env_integer(
                env, "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", TRANSFER_THREADS, minimum=1
            ),
            host_ip=env.get("SGLANG_HOST_IP") or None,
            fault=fault,
        )
