"""Read the argv pdkit renders for ``python -m sglang.launch_server``.

The sim honours the flags that change what a worker does or how fast it is (model, addresses,
disaggregation role and ports, parallel sizes, memory and batching limits, metrics, keys,
HiCache and its storage backend), the
flags that change which requests it takes (``--context-length``, ``--allow-auto-truncate``,
``--enable-custom-logit-processor``: see `kit.sim.admission`) and
accepts every other SGLang flag without acting on it: those are kept in `WorkerArgs.ignored` and
shown in ``/server_info``. A malformed value of an honoured flag is an error, as in SGLang.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from kit.net import bare_host
from kit.topology.launch import Parallelism, WorkerLaunch

DISAGGREGATION_MODES = ("null", "prefill", "decode")
# SGLang 0.5.23 accepts these backends; the sim moves KV with Mooncake for the first two and
# fakes the transfer (decode only, like SGLang) for `fake`.
TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "nixl", "ascend", "fake", "mori")
SIM_TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "fake")
KV_CACHE_DTYPES = (
    "auto",
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp4_e2m1",
)
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOAD_BALANCE_METHODS = (
    "auto",
    "round_robin",
    "follow_bootstrap_room",
    "shortest_queue",
    "minimum_tokens",
    "total_requests",
    "total_tokens",
)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ArgsError(ValueError):
    """The argv cannot start a worker; the message is argparse's or names the flag."""


@dataclass(frozen=True)
class WorkerArgs:
    """The launch arguments the sim acts on, with SGLang's defaults."""

    model_path: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_ib_device: str | None = None
    # SGLang verifies the KV's Adler-32 on the decode only when both roles set it.
    disaggregation_enable_kv_checksum: bool = False
    enable_pd_role_switch: bool = False
    """`POST /pd_role_switch` may flip the role at run time (`kit.sim.role_switch`)."""
    tp_size: int = 1
    dp_size: int = 1
    enable_dp_attention: bool = False
    pp_size: int = 1
    ep_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    base_gpu_id: int = 0
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None
    enable_mixed_chunk: bool = False
    num_reserved_decode_tokens: int = 512
    disaggregation_decode_extra_slots: int | None = None
    mem_fraction_static: float | None = None
    context_length: int | None = None
    # Request shaping (SGLang's tokenizer manager reads these).
    allow_auto_truncate: bool = False
    enable_custom_logit_processor: bool = False
    enable_metrics: bool = False
    api_key: str | None = None
    admin_api_key: str | None = None
    load_balance_method: str = "auto"
    # HiCache: the sim emulates the prefix cache only with it on (L1+L2 on the instance) and,
    # with the mooncake storage backend, its L3 on the real Mooncake Store (kit.sim.prefix).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = None
    hicache_storage_backend: str | None = None
    enable_cache_report: bool = False
    random_seed: int | None = None
    log_level: str = "info"
    # The radix cache (on by default on a prefill, off on a decode unless asked) and its KV
    # events: the sim models the cache only where it publishes them (`kit.sim.prefix_cache`).
    disable_radix_cache: bool = False
    disaggregation_decode_enable_radix_cache: bool = False
    kv_events: KvEventsConfig | None = None
    ignored: tuple[str, ...] = field(default=())

    @property
    def radix_cache(self) -> bool:
        """Whether this worker keeps a radix (prefix) cache, as SGLang decides."""
        if self.disable_radix_cache:
            return False
        return self.disaggregation_mode != "decode" or self.disaggregation_decode_enable_radix_cache

    @property
    def is_pd(self) -> bool:
        """True for a prefill or decode worker."""
        return self.disaggregation_mode != "null"

    @property
    def dp_ranks(self) -> int:
        """Schedulers this worker runs (one per data-parallel rank)."""
        return self.dp_size

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(
            tp=self.tp_size,
            dp=self.dp_size,
            dp_attention=self.enable_dp_attention,
            ep=self.ep_size,
            pp=self.pp_size,
        )

    def launch(self, gpu_type: str | None, speed: float = 1.0) -> WorkerLaunch:
        """The launch record these arguments start (the same record the Plan carries), on
        `gpu_type` (PDKIT_SIM_GPU) at `speed` (PDKIT_SIM_SPEED)."""
        return WorkerLaunch(
            model_path=self.model_path,
            gpu_type=gpu_type,
            parallelism=self.parallelism,
            nnodes=self.nnodes,
            page_size=self.page_size,
            kv_cache_dtype=self.kv_cache_dtype,
            mem_fraction_static=self.mem_fraction_static,
            max_running_requests=self.max_running_requests,
            max_total_tokens=self.max_total_tokens,
            max_prefill_tokens=self.max_prefill_tokens,
            chunked_prefill_size=self.chunked_prefill_size,
            context_length=self.context_length,
            enable_mixed_chunk=self.enable_mixed_chunk,
            num_reserved_decode_tokens=self.num_reserved_decode_tokens,
            disaggregation_decode_extra_slots=self.disaggregation_decode_extra_slots,
            speed=speed,
        )

    def as_dict(self) -> dict[str, Any]:
        """The resolved arguments, for ``/server_info``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["ignored"] = list(self.ignored)
        events = out.pop("kv_events")
        out["kv_events_config"] = (
            None
            if events is None
            else json.dumps(
                {"publisher": "zmq", "endpoint": events.endpoint, "topic": events.topic}
            )
        )
        for secret in ("api_key", "admin_api_key"):
            if out[secret]:
                out[secret] = "<redacted>"
        return out


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _chunk(text: str) -> int:
    value = int(text)
    if value == 0 or value < -1:
        raise argparse.ArgumentTypeError(f"must be a positive token count or -1, got {text}")
    return value


def _host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kit.sim",
        description="pdkit's emulated SGLang worker; takes sglang.launch_server's arguments.",
        allow_abbrev=False,
    )
    add = p.add_argument
    add("--model-path", "--model", required=True)
    add("--served-model-name")
    add("--host", default="127.0.0.1")
    add("--port", type=_port, default=30000)
    add("--disaggregation-mode", choices=DISAGGREGATION_MODES, default="null")
    add("--disaggregation-bootstrap-port", type=_port, default=8998)
    add("--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS, default="mooncake")
    add("--disaggregation-ib-device")
    add("--disaggregation-enable-kv-checksum", action="store_true")
    add("--enable-pd-role-switch", action="store_true")
    add("--tp-size", "--tp", "--tensor-parallel-size", type=_positive, default=1)
    add("--dp-size", "--dp", "--data-parallel-size", type=_positive, default=1)
    add("--enable-dp-attention", action="store_true")
    add("--attn-dp-size", "--attention-data-parallel-size", type=_positive)
    add("--pp-size", "--pp", "--pipeline-parallel-size", type=_positive, default=1)
    add("--ep-size", "--ep", "--expert-parallel-size", type=_positive, default=1)
    add("--nnodes", type=_positive, default=1)
    add("--node-rank", type=_non_negative, default=0)
    add("--dist-init-addr", "--nccl-init-addr", type=_host_port)
    add("--base-gpu-id", type=_non_negative, default=0)
    add("--page-size", type=_positive)
    add("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    add("--dtype", choices=DTYPES, default="auto")
    add("--quantization")
    add("--max-running-requests", type=_positive)
    add("--max-total-tokens", type=_positive)
    add("--max-prefill-tokens", type=_positive, default=16384)
    add("--chunked-prefill-size", type=_chunk)
    add("--enable-mixed-chunk", action="store_true")
    add("--num-reserved-decode-tokens", type=_non_negative, default=512)
    add("--disaggregation-decode-extra-slots", type=_non_negative)
    add("--mem-fraction-static", type=_fraction)
    add("--context-length", type=_positive)
    add("--allow-auto-truncate", action="store_true")
    add("--enable-custom-logit-processor", action="store_true")
    add("--enable-metrics", action="store_true")
    add("--api-key")
    add("--admin-api-key")
    add("--load-balance-method", choices=LOAD_BALANCE_METHODS, default="auto")
    add("--enable-hierarchical-cache", "--enable-hicache", action="store_true")
    add("--hicache-ratio", type=float)
    add("--hicache-storage-backend")
    add("--disable-radix-cache", action="store_true")
    add("--enable-cache-report", action="store_true")
    add("--random-seed", type=int)
    add("--log-level", choices=LOG_LEVELS, default="info")
    add("--disaggregation-decode-enable-radix-cache", action="store_true")
    add("--kv-events-config", type=_kv_events)
    return p


@dataclass(frozen=True)
class KvEventsConfig:
    """The part of SGLang's `KVEventsConfig` the sim honours (a zmq publisher)."""

    endpoint: str = "tcp://*:5557"
    topic: str = ""


def _kv_events(text: str) -> KvEventsConfig:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}") from exc
    if not isinstance(raw, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    if raw.get("publisher", "null") != "zmq":
        raise argparse.ArgumentTypeError('the sim publishes KV events with "publisher": "zmq" only')
    endpoint = raw.get("endpoint", "tcp://*:5557")
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        raise argparse.ArgumentTypeError(f"endpoint must be tcp://HOST:PORT, got {endpoint!r}")
    return KvEventsConfig(endpoint=endpoint, topic=str(raw.get("topic", "")))


def parse_args(argv: Sequence[str]) -> WorkerArgs:
    """Parse SGLang's launch argv; raise `ArgsError` for a malformed honoured flag."""
    parser = _parser()

    def fail(message: str) -> Any:
        raise ArgsError(f"{parser.prog}: error: {message}")

    parser.error = fail  # type: ignore[method-assign]
    ns, unknown = parser.parse_known_args(list(argv))
    if ns.node_rank >= ns.nnodes:
        fail(f"--node-rank {ns.node_rank} must be < --nnodes {ns.nnodes}")
    if ns.nnodes > 1 and not ns.dist_init_addr:
        fail("--nnodes > 1 needs --dist-init-addr HOST:PORT, as in SGLang")
    if ns.attn_dp_size and ns.attn_dp_size > 1:
        # SGLang 0.5.23's spelling of DP attention (--dp-size N --enable-dp-attention).
        ns.enable_dp_attention, ns.dp_size = True, ns.attn_dp_size
    if ns.enable_dp_attention and ns.tp_size % ns.dp_size:
        fail(
            f"--tp-size {ns.tp_size} must be a multiple of --dp-size {ns.dp_size} "
            "with --enable-dp-attention"
        )
    if (ns.tp_size * ns.pp_size) % ns.nnodes:
        fail(
            f"--tp-size x --pp-size ({ns.tp_size * ns.pp_size}) must be divisible by "
            f"--nnodes {ns.nnodes}"
        )
    if ns.disaggregation_mode != "null":
        if ns.disaggregation_transfer_backend not in SIM_TRANSFER_BACKENDS:
            fail(
                f"--disaggregation-transfer-backend {ns.disaggregation_transfer_backend}: "
                f"the sim engine moves KV with Mooncake only; use one of "
                f"{', '.join(SIM_TRANSFER_BACKENDS)}"
            )
        if ns.disaggregation_mode == "prefill" and ns.disaggregation_transfer_backend == "fake":
            fail("--disaggregation-transfer-backend fake works on a decode only (as in SGLang)")
    _check_host(ns.host, fail)
    # SGLang's page size is 1 when --page-size is absent (for the attention backends it picks
    # on NVIDIA GPUs); pdkit always renders it, as it must match between the roles.
    return WorkerArgs(
        model_path=ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        host=ns.host,
        port=ns.port,
        disaggregation_mode=ns.disaggregation_mode,
        disaggregation_bootstrap_port=ns.disaggregation_bootstrap_port,
        disaggregation_transfer_backend=ns.disaggregation_transfer_backend,
        disaggregation_ib_device=ns.disaggregation_ib_device,
        disaggregation_enable_kv_checksum=ns.disaggregation_enable_kv_checksum,
        enable_pd_role_switch=ns.enable_pd_role_switch,
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        enable_dp_attention=ns.enable_dp_attention,
        pp_size=ns.pp_size,
        ep_size=ns.ep_size,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        base_gpu_id=ns.base_gpu_id,
        page_size=ns.page_size or 1,
        kv_cache_dtype=ns.kv_cache_dtype,
        dtype=ns.dtype,
        quantization=ns.quantization,
        max_running_requests=ns.max_running_requests,
        max_total_tokens=ns.max_total_tokens,
        max_prefill_tokens=ns.max_prefill_tokens,
        chunked_prefill_size=ns.chunked_prefill_size,
        enable_mixed_chunk=ns.enable_mixed_chunk,
        num_reserved_decode_tokens=ns.num_reserved_decode_tokens,
        disaggregation_decode_extra_slots=ns.disaggregation_decode_extra_slots,
        mem_fraction_static=ns.mem_fraction_static,
        context_length=ns.context_length,
        allow_auto_truncate=ns.allow_auto_truncate,
        enable_custom_logit_processor=ns.enable_custom_logit_processor,
        enable_metrics=ns.enable_metrics,
        api_key=ns.api_key,
        admin_api_key=ns.admin_api_key,
        load_balance_method=ns.load_balance_method,
        enable_hierarchical_cache=ns.enable_hierarchical_cache,
        # SGLang resolves it at start-up (arg_groups/hicache_hook.py:119): 2.0 but on a decode.
        hicache_ratio=(
            ns.hicache_ratio
            if ns.hicache_ratio is not None or ns.disaggregation_mode == "decode"
            else 2.0
        ),
        hicache_storage_backend=ns.hicache_storage_backend,
        disable_radix_cache=ns.disable_radix_cache,
        enable_cache_report=ns.enable_cache_report,
        random_seed=ns.random_seed,
        log_level=ns.log_level,
        disaggregation_decode_enable_radix_cache=ns.disaggregation_decode_enable_radix_cache,
        kv_events=ns.kv_events_config,
        ignored=tuple(unknown),
    )


def _check_host(host: str, fail: Any) -> None:
    """Accept an IP literal (bracketed IPv6 too) or a plausible host name."""
    bare = bare_host(host)
    try:
        ipaddress.ip_address(bare)
        return
    except ValueError:
        pass
    label_ok = all(
        part and len(part) <= 63 and part.replace("-", "").isalnum() for part in bare.split(".")
    )
    if not bare or not label_ok:
        fail(f"--host {host!r} is neither an IP address nor a host name")
