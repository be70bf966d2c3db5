"""The values SGLang 0.5.23 accepts on the command line but refuses when the server starts.

Each rule cites the SGLang 0.5.23 file:line that raises it (under `sglang/srt`) and quotes its
message. Rules are in the order SGLang runs its hooks (`arg_groups/pipeline.py`, then
`check_server_args`), so where one key breaks several rules the first is the one SGLang
reports. Left out: checks that read the GPU, the model's config or the installed kernels, and
those pdkit's own checks already make (kit/sglang/check.py: owned flags, prefill_complete's
transfer backend and attention-TP, decode attn-cp-size).
"""

from __future__ import annotations

from kit.sglang.startup.rules import (
    LaunchValues,
    Refuses,
    StartupRule,
    at_most,
    below,
    given_all,
    json_not_object,
    nonnegative,
    outside,
    positive,
    without,
)
from kit.topology.schema import ROLE_NAMES

_PD = "pd_disaggregation_hook"
_CHECK = "validation_hook.check_server_args"
_SSL = "serving_hook.handle_ssl_validation"
_GRPC = "serving_hook.handle_deprecated_args"
_DWDP = "parallel_hook.handle_dwdp"
_DCP = "parallel_hook.handle_decode_context_parallelism"
_HICACHE = "hicache_hook.handle_hicache"
_NO_KV = "kv_cache_hook.validate_prefill_only_disable_kv_cache_args"


def _attention_dp(v: LaunchValues) -> bool:
    """Attention DP after SGLang turns `--dp-size N --enable-dp-attention` into
    `--attn-dp-size N` (parallel_hook.handle_deprecated_dp_attention) and DWDP sets it."""
    return (
        v.size("attn-dp-size") > 1
        or (v.on("enable-dp-attention") and v.size("dp-size") > 1)
        or v.size("dwdp-size") > 1
    )


def _host_receive(v: LaunchValues) -> bool:
    """Decode host KV buffering: --disaggregation-decode-host-receive-threshold below 1."""
    threshold = v.number("disaggregation-decode-host-receive-threshold")
    return threshold is not None and threshold < 1


def _decode_radix_cache(v: LaunchValues) -> bool:
    """Whether the radix cache stays on: a decode server turns it off unless
    --disaggregation-decode-enable-radix-cache (pd_disaggregation_hook.py:98)."""
    if v.mode == "decode":
        return v.on("disaggregation-decode-enable-radix-cache")
    return not v.on("disable-radix-cache")


def _hicache_checked(v: LaunchValues) -> bool:
    """Whether SGLang validates the host-memory mode (hicache_hook.handle_hicache): HiCache on,
    decode KV offload on, or a decode server whose retraction backup is the host pool."""
    backup = v.text("disaggregation-decode-retraction-backup")
    if _host_receive(v):
        backup = "host_pool"
    return (
        v.on("enable-hierarchical-cache")
        or v.on("disaggregation-decode-enable-offload-kvcache")
        or (v.mode == "decode" and backup in (None, "host_pool"))
    )


def _gc_threshold_size(v: LaunchValues) -> bool:
    value = v.value("gc-threshold")
    items = value if isinstance(value, list) else [value]
    return v.given("gc-threshold") and not 1 <= len(items) <= 3


def _chunk_not_page_multiple(v: LaunchValues) -> bool:
    chunk, page = v.number("chunked-prefill-size"), v.number("page-size")
    if chunk is None or page is None or page <= 0 or v.mode == "decode":
        return False
    return chunk > 0 and chunk % page != 0


def _role_switch_unsupported(v: LaunchValues) -> bool:
    return v.on("enable-pd-role-switch") and (
        v.size("ep-size") > 1
        or v.text("moe-a2a-backend") not in (None, "none")
        or v.size("pp-size") > 1
        or (_attention_dp(v) and v.on("enable-dp-attention-local-control-broadcast"))
        or v.size("dcp-size") > 1
        or v.given("speculative-algorithm")
    )


def _legacy_grpc(v: LaunchValues) -> bool:
    return v.on("grpc-mode") or v.on("smg-grpc-mode")


def _prefill_complete(
    name: str, flag: str, what: str, refuses: Refuses, *modes: str
) -> StartupRule:
    """`flag` turns on a feature the prefill_complete decode allocation policy does not support
    (`what`, as SGLang lists it)."""
    return StartupRule(
        name=f"prefill-complete-{name}",
        flag=flag,
        refuses=lambda v: (
            v.text("disaggregation-decode-allocation-policy") == "prefill_complete" and refuses(v)
        ),
        says=f"--disaggregation-decode-allocation-policy prefill_complete does not yet support "
        f"{what}",
        fix=f"remove {flag}, or use the default decode allocation policy (early).",
        hook=f"{_PD}.handle_pd_disaggregation",
        source="arg_groups/pd_disaggregation_hook.py:239",
        modes=modes or ROLE_NAMES,
    )


RULES: tuple[StartupRule, ...] = (
    StartupRule(
        "hicache-host-memory-fraction-range",
        "hicache-host-memory-fraction",
        outside("hicache-host-memory-fraction", 0, 1, open_low=True, open_high=False),
        "--hicache-host-memory-fraction must be in (0, 1].",
        "set hicache-host-memory-fraction above 0 and at most 1.",
        "hicache_hook.handle_hicache_ratio_default",
        "arg_groups/hicache_hook.py:117",
    ),
    StartupRule(
        "ple-offload-with-layer-offload",
        "ple-offload-embedding",
        lambda v: (
            v.on("ple-offload-embedding")
            and ((v.number("cpu-offload-gb") or 0) > 0 or (v.number("offload-group-size") or 0) > 0)
        ),
        "--ple-offload-embedding cannot be combined with --cpu-offload-gb or --offload-group-size",
        "remove cpu-offload-gb and offload-group-size, or ple-offload-embedding.",
        "memory_hook.handle_offload_compatibility",
        "arg_groups/memory_hook.py:34",
    ),
    nonnegative(
        "prefill-decode-interval",
        "--prefill-decode-interval must be non-negative.",
        "validation_hook.validate_prefill_decode_interval",
        "arg_groups/validation_hook.py:660",
    ),
    nonnegative(
        "prefill-decode-interval-min-bs",
        "--prefill-decode-interval-min-bs must be non-negative.",
        "validation_hook.validate_prefill_decode_interval",
        "arg_groups/validation_hook.py:662",
    ),
    StartupRule(
        "response-store-in-pd",
        "enable-response-store",
        given_all("enable-response-store"),
        "--enable-response-store is not supported with --disaggregation-mode=prefill or decode",
        "remove enable-response-store: PD servers keep no response store.",
        "validation_hook.validate_response_store",
        "arg_groups/validation_hook.py:112",
    ),
    positive(
        "sampling-mask-max-tokens",
        "--sampling-mask-max-tokens must be positive (got {sampling-mask-max-tokens}).",
        "validation_hook.validate_sampling_mask_max_tokens",
        "arg_groups/validation_hook.py:688",
    ),
    StartupRule(
        "aux-hidden-state-layers-without-capture",
        "return-aux-hidden-state-layer-ids",
        without("return-aux-hidden-state-layer-ids", "enable-return-aux-hidden-states"),
        "--return-aux-hidden-state-layer-ids requires --enable-return-aux-hidden-states.",
        "add enable-return-aux-hidden-states: true, or remove return-aux-hidden-state-layer-ids.",
        "validation_hook.handle_aux_hidden_state_capture",
        "arg_groups/validation_hook.py:707",
    ),
    StartupRule(
        "aux-hidden-state-capture-without-method",
        "enable-return-aux-hidden-states",
        lambda v: (
            v.on("enable-return-aux-hidden-states")
            and (v.text("speculative-algorithm") or "").upper()
            not in ("EAGLE3", "DFLASH", "DSPARK")
        ),
        "--enable-return-aux-hidden-states needs --speculative-algorithm EAGLE3, DFLASH or DSPARK "
        "to name the capture convention",
        "set speculative-algorithm to EAGLE3, DFLASH or DSPARK.",
        "validation_hook.handle_aux_hidden_state_capture",
        "arg_groups/validation_hook.py:714",
    ),
    nonnegative(
        "mm-preprocess-cache-size-mb",
        "mm_preprocess_cache_size_mb must be non-negative",
        "serving_hook.handle_multimodal",
        "arg_groups/serving_hook.py:145",
    ),
    StartupRule(
        "ssl-keyfile-without-certfile",
        "ssl-keyfile",
        without("ssl-keyfile", "ssl-certfile"),
        "--ssl-keyfile requires --ssl-certfile to be specified as well.",
        "add ssl-certfile.",
        _SSL,
        "arg_groups/serving_hook.py:51",
    ),
    StartupRule(
        "ssl-certfile-without-keyfile",
        "ssl-certfile",
        without("ssl-certfile", "ssl-keyfile"),
        "--ssl-certfile requires --ssl-keyfile to be specified as well.",
        "add ssl-keyfile.",
        _SSL,
        "arg_groups/serving_hook.py:55",
    ),
    StartupRule(
        "ssl-ca-certs-without-tls",
        "ssl-ca-certs",
        lambda v: (
            v.given("ssl-ca-certs") and not (v.given("ssl-certfile") or v.given("ssl-keyfile"))
        ),
        "--ssl-ca-certs has no effect without --ssl-certfile and --ssl-keyfile.",
        "add ssl-certfile and ssl-keyfile, or remove ssl-ca-certs.",
        _SSL,
        "arg_groups/serving_hook.py:60",
    ),
    StartupRule(
        "ssl-keyfile-password-without-tls",
        "ssl-keyfile-password",
        lambda v: (
            v.given("ssl-keyfile-password")
            and not (v.given("ssl-certfile") or v.given("ssl-keyfile"))
        ),
        "--ssl-keyfile-password has no effect without --ssl-certfile and --ssl-keyfile.",
        "add ssl-certfile and ssl-keyfile, or remove ssl-keyfile-password.",
        _SSL,
        "arg_groups/serving_hook.py:64",
    ),
    StartupRule(
        "ssl-refresh-without-tls",
        "enable-ssl-refresh",
        lambda v: (
            v.on("enable-ssl-refresh") and not (v.given("ssl-certfile") or v.given("ssl-keyfile"))
        ),
        "--enable-ssl-refresh requires --ssl-certfile and --ssl-keyfile to be specified.",
        "add ssl-certfile and ssl-keyfile, or remove enable-ssl-refresh.",
        _SSL,
        "arg_groups/serving_hook.py:84",
    ),
    StartupRule(
        "http-worker-reuseport-single-worker",
        "enable-http-worker-reuseport",
        lambda v: (
            v.on("enable-http-worker-reuseport")
            and (v.size("tokenizer-worker-num") == 1 or v.on("enable-http2"))
        ),
        "--enable-http-worker-reuseport requires --tokenizer-worker-num > 1 and has no effect "
        "with --enable-http2.",
        "set tokenizer-worker-num above 1 without enable-http2, or remove "
        "enable-http-worker-reuseport.",
        _SSL,
        "arg_groups/serving_hook.py:91",
    ),
    StartupRule(
        "http2-max-concurrent-streams-range",
        "http2-max-concurrent-streams",
        lambda v: (
            v.on("enable-http2")
            and outside("http2-max-concurrent-streams", 0, 2**32, open_low=True, open_high=True)(v)
        ),
        "--http2-max-concurrent-streams must be between 1 and 4294967295.",
        "set http2-max-concurrent-streams between 1 and 4294967295.",
        _SSL,
        "arg_groups/serving_hook.py:98",
    ),
    StartupRule(
        "http2-window-range",
        "http2-initial-connection-window-size",
        lambda v: (
            v.on("enable-http2")
            and outside(
                "http2-initial-connection-window-size", 1024, 2**31, open_low=False, open_high=True
            )(v)
        ),
        "--http2-initial-connection-window-size must be between 1024 and 2147483647.",
        "set http2-initial-connection-window-size between 1024 and 2147483647.",
        _SSL,
        "arg_groups/serving_hook.py:102",
    ),
    positive(
        "asr-max-buffer-seconds",
        "--asr-max-buffer-seconds must be positive (got {asr-max-buffer-seconds}).",
        "serving_hook.handle_asr_validation",
        "arg_groups/serving_hook.py:127",
    ),
    positive(
        "asr-max-concurrent-sessions",
        "--asr-max-concurrent-sessions must be positive (got {asr-max-concurrent-sessions}).",
        "serving_hook.handle_asr_validation",
        "arg_groups/serving_hook.py:132",
    ),
    StartupRule(
        "fast-image-processor-backend-conflict",
        "disable-fast-image-processor",
        lambda v: (
            v.on("disable-fast-image-processor")
            and v.text("image-processor-backend") not in ("auto", "pil")
        ),
        "--disable-fast-image-processor conflicts with "
        "--image-processor-backend={image-processor-backend}.",
        "remove disable-fast-image-processor (deprecated; image-processor-backend: pil is its "
        "replacement).",
        _GRPC,
        "arg_groups/serving_hook.py:260",
    ),
    positive(
        "grpc-response-timeout-secs",
        "--grpc-response-timeout-secs must be positive",
        _GRPC,
        "arg_groups/serving_hook.py:379",
    ),
    StartupRule(
        "grpc-port-range",
        "grpc-port",
        outside("grpc-port", 1, 65535, open_low=False, open_high=False),
        "--grpc-port / SGLANG_GRPC_PORT ({grpc-port}) must be between 1 and 65535",
        "set grpc-port between 1 and 65535.",
        _GRPC,
        "arg_groups/serving_hook.py:383",
    ),
    StartupRule(
        "sidecar-args-without-sidecar",
        "sidecar-args",
        without("sidecar-args", "sidecar"),
        "--sidecar-args requires --sidecar.",
        "add sidecar, or remove sidecar-args.",
        _GRPC,
        "arg_groups/serving_hook.py:397",
    ),
    StartupRule(
        "sidecar-empty",
        "sidecar",
        lambda v: v.given("sidecar") and not str(v.value("sidecar")).strip(),
        "--sidecar must not be empty.",
        "name the sidecar command, or remove sidecar.",
        _GRPC,
        "arg_groups/serving_hook.py:404",
    ),
    StartupRule(
        "sidecar-with-legacy-grpc",
        "sidecar",
        lambda v: v.given("sidecar") and (v.on("grpc-mode") or v.on("smg-grpc-mode")),
        "--sidecar requires SGLang's native gRPC server; it cannot be combined with "
        "--smg-grpc-mode/--grpc-mode.",
        "remove grpc-mode and smg-grpc-mode and set grpc-port.",
        _GRPC,
        "arg_groups/serving_hook.py:406",
    ),
    StartupRule(
        "sidecar-without-grpc-port",
        "sidecar",
        without("sidecar", "grpc-port"),
        "--sidecar requires --grpc-port or SGLANG_GRPC_PORT.",
        "set grpc-port.",
        _GRPC,
        "arg_groups/serving_hook.py:411",
    ),
    StartupRule(
        "grpc-port-with-ray",
        "grpc-port",
        lambda v: v.given("grpc-port") and v.on("use-ray") and not _legacy_grpc(v),
        "--grpc-port is not supported with --use-ray",
        "remove use-ray or grpc-port.",
        _GRPC,
        "arg_groups/serving_hook.py:414",
    ),
    StartupRule(
        "grpc-port-with-tokenizer-workers",
        "grpc-port",
        lambda v: (
            v.given("grpc-port") and v.size("tokenizer-worker-num") > 1 and not _legacy_grpc(v)
        ),
        "Native gRPC does not yet support --tokenizer-worker-num > 1.",
        "set tokenizer-worker-num: 1, or remove grpc-port.",
        _GRPC,
        "arg_groups/serving_hook.py:424",
    ),
    # handle_pd_disaggregation checks prefill_complete first; kit/sglang/check.py already
    # covers its transfer backend and pp, and attention-TP as pdkit counts it.
    StartupRule(
        "prefill-complete-attention-tp",
        "disaggregation-decode-allocation-policy",
        lambda v: (
            v.text("disaggregation-decode-allocation-policy") == "prefill_complete"
            and v.size("tp-size") > 1
            # check.py reports the other layouts; this is the one it lets through.
            and v.size("attn-dp-size") == v.size("tp-size")
        ),
        "--disaggregation-decode-allocation-policy prefill_complete does not yet support "
        "attention tensor parallelism greater than one",
        "set tp: 1 on the roles with tp above 1, or use the default decode allocation policy "
        "(early). This check of SGLang 0.5.23 counts attention DP only from the deprecated "
        "--enable-dp-attention, which pdkit no longer renders (pd_disaggregation_hook.py:208), "
        "so dp = tp does not make attention-TP 1.",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:239",
    ),
    _prefill_complete(
        "prefill-attn-cp",
        "attn-cp-size",
        "pipeline or attention context parallelism",
        lambda v: v.size("attn-cp-size") != 1,
        "prefill",  # on decode, check.py already requires attn-cp-size 1
    ),
    _prefill_complete(
        "dcp",
        "dcp-size",
        "pipeline or attention context parallelism",
        lambda v: v.size("dcp-size") != 1,
    ),
    _prefill_complete(
        "pdmux",
        "enable-pdmux",
        "PD multiplexing or decoupled speculation",
        given_all("enable-pdmux"),
    ),
    _prefill_complete(
        "decoupled-spec",
        "decoupled-spec-role",
        "PD multiplexing or decoupled speculation",
        lambda v: v.text("decoupled-spec-role") not in (None, "null"),
    ),
    _prefill_complete(
        "role-switch",
        "enable-pd-role-switch",
        "runtime PD role switching",
        given_all("enable-pd-role-switch"),
    ),
    _prefill_complete(
        "encoder-only", "encoder-only", "encoder disaggregation", given_all("encoder-only")
    ),
    _prefill_complete(
        "language-only", "language-only", "encoder disaggregation", given_all("language-only")
    ),
    _prefill_complete("hisparse", "enable-hisparse", "HiSparse", given_all("enable-hisparse")),
    _prefill_complete(
        "host-receive",
        "disaggregation-decode-host-receive-threshold",
        "decode host KV buffering",
        _host_receive,
    ),
    _prefill_complete(
        "decode-radix-cache",
        "disaggregation-decode-enable-radix-cache",
        "decode radix cache or decode HiCache",
        given_all("disaggregation-decode-enable-radix-cache"),
        "decode",
    ),
    _prefill_complete(
        "decode-hicache",
        "enable-hierarchical-cache",
        "decode radix cache or decode HiCache",
        given_all("enable-hierarchical-cache"),
        "decode",
    ),
    _prefill_complete(
        "prefill-hicache",
        "enable-hierarchical-cache",
        "prefill HiCache other than L2 write_back",
        lambda v: (
            v.on("enable-hierarchical-cache")
            and (
                v.given("hicache-storage-backend") or v.text("hicache-write-policy") != "write_back"
            )
        ),
        "prefill",
    ),
    StartupRule(
        "decode-host-receive-threshold-range",
        "disaggregation-decode-host-receive-threshold",
        outside(
            "disaggregation-decode-host-receive-threshold", 0, 1, open_low=False, open_high=False
        ),
        "--disaggregation-decode-host-receive-threshold must be between 0 and 1",
        "set disaggregation-decode-host-receive-threshold between 0 and 1 (1 turns decode host "
        "KV buffering off).",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:65",
    ),
    StartupRule(
        "decode-host-receive-with-hisparse-or-role-switch",
        "disaggregation-decode-host-receive-threshold",
        lambda v: _host_receive(v) and (v.on("enable-hisparse") or v.on("enable-pd-role-switch")),
        "Decode host receive does not yet support HiSparse or role switching",
        "set disaggregation-decode-host-receive-threshold: 1, or remove enable-hisparse and "
        "enable-pd-role-switch.",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:70",
    ),
    StartupRule(
        "decode-host-receive-with-cpu-tensor-backup",
        "disaggregation-decode-host-receive-threshold",
        lambda v: (
            _host_receive(v) and v.text("disaggregation-decode-retraction-backup") == "cpu_tensor"
        ),
        "Decode host KV buffering requires host_pool retraction",
        "set disaggregation-decode-retraction-backup: host_pool, or "
        "disaggregation-decode-host-receive-threshold: 1.",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:75",
    ),
    StartupRule(
        "decode-radix-cache-with-hisparse",
        "disaggregation-decode-enable-radix-cache",
        given_all("disaggregation-decode-enable-radix-cache", "enable-hisparse"),
        "--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse",
        "remove disaggregation-decode-enable-radix-cache or enable-hisparse on decode.",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:101",
        modes=("decode",),
    ),
    StartupRule(
        "pd-role-switch-unsupported-features",
        "enable-pd-role-switch",
        _role_switch_unsupported,
        "--enable-pd-role-switch does not rebuild role-specific state for the following features",
        "remove enable-pd-role-switch, or the expert/pipeline/decode-context parallelism, MoE "
        "all-to-all and speculative decoding it cannot rebuild.",
        f"{_PD}.handle_pd_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:191",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-without-embedding",
        "prefill-only-disable-kv-cache",
        without("prefill-only-disable-kv-cache", "is-embedding"),
        "--prefill-only-disable-kv-cache currently requires --is-embedding.",
        "remove prefill-only-disable-kv-cache (it serves embedding models only).",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:880",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-fp4",
        "prefill-only-disable-kv-cache",
        lambda v: (
            v.on("prefill-only-disable-kv-cache")
            and v.text("kv-cache-dtype") in ("nvfp4", "fp4_mx_block16")
        ),
        "--prefill-only-disable-kv-cache does not currently support --kv-cache-dtype=nvfp4 or "
        "--kv-cache-dtype=fp4_mx_block16",
        "remove prefill-only-disable-kv-cache, or use another kv-cache-dtype.",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:886",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-mxfp8",
        "prefill-only-disable-kv-cache",
        lambda v: v.on("prefill-only-disable-kv-cache") and v.text("kv-cache-dtype") == "mxfp8",
        "--prefill-only-disable-kv-cache does not currently support --kv-cache-dtype=mxfp8",
        "remove prefill-only-disable-kv-cache, or use another kv-cache-dtype.",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:892",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-chunked",
        "prefill-only-disable-kv-cache",
        lambda v: v.on("prefill-only-disable-kv-cache") and v.number("chunked-prefill-size") != -1,
        "--prefill-only-disable-kv-cache requires --chunked-prefill-size=-1",
        "set chunked-prefill-size: -1.",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:905",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-radix",
        "prefill-only-disable-kv-cache",
        lambda v: v.on("prefill-only-disable-kv-cache") and _decode_radix_cache(v),
        "--prefill-only-disable-kv-cache requires --disable-radix-cache",
        "add disable-radix-cache: true.",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:911",
    ),
    StartupRule(
        "prefill-only-disable-kv-cache-attn-cp",
        "prefill-only-disable-kv-cache",
        lambda v: v.on("prefill-only-disable-kv-cache") and v.size("attn-cp-size") > 1,
        "--prefill-only-disable-kv-cache is incompatible with --attn-cp-size > 1",
        "remove prefill-only-disable-kv-cache, or attn-cp-size.",
        _NO_KV,
        "arg_groups/kv_cache_hook.py:920",
    ),
    StartupRule(
        "dcp-size-below-one",
        "dcp-size",
        below("dcp-size", 1),
        "Decode context parallel size (--dcp-size / --decode-context-parallel-size) must be >= 1",
        "set dcp-size to 1 or more.",
        _DCP,
        "arg_groups/parallel_hook.py:244",
    ),
    StartupRule(
        "dcp-with-prefill-cp",
        "dcp-size",
        lambda v: v.size("dcp-size") > 1 and v.on("enable-prefill-cp"),
        "--dcp-size > 1 does not support --enable-prefill-cp.",
        "remove enable-prefill-cp, or set dcp-size: 1.",
        _DCP,
        "arg_groups/parallel_hook.py:250",
    ),
    StartupRule(
        "dcp-comm-backend-without-dcp",
        "dcp-comm-backend",
        lambda v: v.text("dcp-comm-backend") in ("a2a", "fi_a2a") and v.size("dcp-size") <= 1,
        "--dcp-comm-backend {dcp-comm-backend} only affects the decode context-parallel attention "
        "reduction and therefore requires --dcp-size / --decode-context-parallel-size > 1",
        "remove dcp-comm-backend, or set dcp-size above 1.",
        _DCP,
        "arg_groups/parallel_hook.py:252",
    ),
    StartupRule(
        "dcp-replicate-q-proj-without-dcp",
        "dcp-replicate-q-proj",
        lambda v: v.on("dcp-replicate-q-proj") and v.size("dcp-size") <= 1,
        "--dcp-replicate-q-proj requires --dcp-size > 1.",
        "remove dcp-replicate-q-proj, or set dcp-size above 1.",
        _DCP,
        "arg_groups/parallel_hook.py:267",
    ),
    StartupRule(
        "dcp-replicate-q-proj-with-ag-rs",
        "dcp-replicate-q-proj",
        lambda v: (
            v.on("dcp-replicate-q-proj")
            and v.size("dcp-size") > 1
            and v.text("dcp-comm-backend") == "ag_rs"
        ),
        "--dcp-replicate-q-proj only applies to the a2a/fi_a2a DCP communication backend",
        "set dcp-comm-backend to a2a, or remove dcp-replicate-q-proj.",
        _DCP,
        "arg_groups/parallel_hook.py:269",
    ),
    StartupRule(
        "dwdp-size-not-tp",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1 and v.number("dwdp-size") != v.number("tp-size"),
        "dwdp_size ({dwdp-size}) must equal tp_size ({tp-size})",
        "set dwdp-size to the role's tp, or remove it.",
        _DWDP,
        "arg_groups/parallel_hook.py:441",
    ),
    StartupRule(
        "dwdp-on-decode",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1,
        "DWDP requires --disaggregation-mode null or prefill",
        "set dwdp-size on prefill only (prefill.args).",
        _DWDP,
        "arg_groups/parallel_hook.py:444",
        modes=("decode",),
    ),
    StartupRule(
        "dwdp-with-eplb",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1 and v.on("enable-eplb"),
        "EPLB dynamic migration conflicts with static DWDP partitioning",
        "remove enable-eplb or dwdp-size.",
        _DWDP,
        "arg_groups/parallel_hook.py:448",
    ),
    StartupRule(
        "dwdp-with-speculative",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1 and v.given("speculative-algorithm"),
        "DWDP does not support speculative decoding (MTP/draft workers)",
        "remove speculative-algorithm or dwdp-size.",
        _DWDP,
        "arg_groups/parallel_hook.py:451",
    ),
    StartupRule(
        "dwdp-with-pp",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1 and v.size("pp-size") != 1,
        "DWDP requires pp_size == 1",
        "set the role's pp to 1, or remove dwdp-size.",
        _DWDP,
        "arg_groups/parallel_hook.py:454",
    ),
    StartupRule(
        "dwdp-with-two-batch-overlap",
        "dwdp-size",
        lambda v: v.size("dwdp-size") > 1 and v.on("enable-two-batch-overlap"),
        "DWDP's prefetch event protocol does not support two-batch overlap",
        "remove enable-two-batch-overlap or dwdp-size.",
        _DWDP,
        "arg_groups/parallel_hook.py:455",
    ),
    StartupRule(
        "linker-mla-dedup-without-mooncake-linker",
        "enable-linker-mla-dedup",
        lambda v: (
            v.on("enable-linker-mla-dedup")
            and not (
                v.on("enable-unified-cache-external-linker")
                and v.text("unified-cache-external-linker-backend") == "mooncake"
            )
        ),
        "--enable-linker-mla-dedup requires the Mooncake linker.",
        "add enable-unified-cache-external-linker with the mooncake linker backend, or remove "
        "enable-linker-mla-dedup.",
        _HICACHE,
        "arg_groups/hicache_hook.py:43",
    ),
    StartupRule(
        "external-linker-without-radix-cache",
        "enable-unified-cache-external-linker",
        lambda v: (
            v.on("enable-unified-cache-external-linker")
            and (not _decode_radix_cache(v) or v.given("radix-cache-backend"))
        ),
        "--enable-unified-cache-external-linker requires the default UnifiedRadixCache with "
        "radix caching enabled.",
        "remove disable-radix-cache and radix-cache-backend (on decode: add "
        "disaggregation-decode-enable-radix-cache), or remove "
        "enable-unified-cache-external-linker.",
        _HICACHE,
        "arg_groups/hicache_hook.py:46",
    ),
    StartupRule(
        "external-linker-with-hicache",
        "enable-unified-cache-external-linker",
        given_all("enable-unified-cache-external-linker", "enable-hierarchical-cache"),
        "--enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually "
        "exclusive.",
        "remove one of them.",
        _HICACHE,
        "arg_groups/hicache_hook.py:51",
    ),
    StartupRule(
        "external-linker-with-hicache-storage",
        "enable-unified-cache-external-linker",
        given_all("enable-unified-cache-external-linker", "hicache-storage-backend"),
        "--enable-unified-cache-external-linker does not use --hicache-storage-backend.",
        "remove hicache-storage-backend.",
        _HICACHE,
        "arg_groups/hicache_hook.py:56",
    ),
    StartupRule(
        "hicache-buffer-only-without-storage",
        "hicache-host-memory-mode",
        lambda v: (
            v.text("hicache-host-memory-mode") == "buffer_only"
            and not v.given("hicache-storage-backend")
            and _hicache_checked(v)
        ),
        "--hicache-host-memory-mode buffer_only requires a storage backend "
        "(--hicache-storage-backend)",
        "set hicache-storage-backend, or hicache-host-memory-mode: cache.",
        _HICACHE,
        "arg_groups/hicache_hook.py:273",
    ),
    StartupRule(
        "hicache-buffer-only-on-decode",
        "hicache-host-memory-mode",
        lambda v: v.text("hicache-host-memory-mode") == "buffer_only" and _hicache_checked(v),
        "--hicache-host-memory-mode buffer_only is not supported on decode instances",
        "set hicache-host-memory-mode: buffer_only on prefill only (prefill.args).",
        _HICACHE,
        "arg_groups/hicache_hook.py:290",
        modes=("decode",),
    ),
    StartupRule(
        "prefix-mm-cache-without-encoder-only",
        "enable-prefix-mm-cache",
        without("enable-prefix-mm-cache", "encoder-only"),
        "--enable-prefix-mm-cache requires --encoder-only to be enabled",
        "remove enable-prefix-mm-cache (encoder-only servers are not PD servers).",
        f"{_PD}.handle_encoder_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:306",
    ),
    StartupRule(
        "encoder-only-with-language-only",
        "encoder-only",
        given_all("encoder-only", "language-only"),
        "Cannot set --encoder-only and --language-only together",
        "remove encoder-only: a PD server is not an encoder-only server.",
        f"{_PD}.handle_encoder_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:310",
    ),
    StartupRule(
        "encoder-only-in-pd",
        "encoder-only",
        given_all("encoder-only"),
        "Cannot set --encoder-only and --disaggregation-mode prefill/decode together",
        "remove encoder-only: a PD server is not an encoder-only server.",
        f"{_PD}.handle_encoder_disaggregation",
        "arg_groups/pd_disaggregation_hook.py:312",
    ),
    StartupRule(
        "tokenizer-batch-encode-with-dynamic-batching",
        "enable-tokenizer-batch-encode",
        given_all("enable-tokenizer-batch-encode", "enable-dynamic-batch-tokenizer"),
        "Cannot enable both --enable-tokenizer-batch-encode and --enable-dynamic-batch-tokenizer.",
        "keep one of enable-tokenizer-batch-encode and enable-dynamic-batch-tokenizer.",
        "serving_hook.handle_tokenizer_batching",
        "arg_groups/serving_hook.py:757",
    ),
    StartupRule(
        "default-chat-template-kwargs-not-object",
        "default-chat-template-kwargs",
        json_not_object("default-chat-template-kwargs"),
        "--default-chat-template-kwargs must decode to a JSON object",
        "write a JSON object, e.g. '{\"enable_thinking\": false}'.",
        "serving_hook.handle_other_validations",
        "arg_groups/serving_hook.py:501",
    ),
    positive(
        "pp-max-micro-batch-size",
        "pp_max_micro_batch_size must be a positive integer or None (for auto-compute).",
        _CHECK,
        "arg_groups/validation_hook.py:183",
    ),
    StartupRule(
        "cuda-graph-padding-off-with-torch-compile",
        "disable-cuda-graph-padding",
        given_all("disable-cuda-graph-padding", "enable-torch-compile"),
        "--disable-cuda-graph-padding is incompatible with --enable-torch-compile.",
        "remove disable-cuda-graph-padding or enable-torch-compile.",
        _CHECK,
        "arg_groups/validation_hook.py:188",
    ),
    positive(
        "gpu-id-step",
        "gpu_id_step must be positive",
        _CHECK,
        "arg_groups/validation_hook.py:205",
    ),
    StartupRule(
        "moe-dense-tp-size-values",
        "moe-dense-tp-size",
        lambda v: (
            v.given("moe-dense-tp-size")
            and v.number("moe-dense-tp-size")
            not in (
                1,
                v.number("tp-size"),
            )
        ),
        "moe_dense_tp_size only supports None, 1, or tp_size currently",
        "set moe-dense-tp-size to 1 or the role's tp, or remove it.",
        _CHECK,
        "arg_groups/validation_hook.py:207",
    ),
    StartupRule(
        "served-model-name-colon",
        "served-model-name",
        lambda v: (
            ":" in (v.text("served-model-name") or "")
            and not (v.text("served-model-name") or "")
            .lower()
            .startswith(("s3://", "gs://", "az://"))
        ),
        "served_model_name cannot contain a colon (':') character.",
        "use a name without ':' (SGLang reserves it for model:adapter LoRA names).",
        _CHECK,
        "arg_groups/validation_hook.py:215",
    ),
    StartupRule(
        "chunked-prefill-not-page-multiple",
        "chunked-prefill-size",
        _chunk_not_page_multiple,
        "chunked_prefill_size must be divisible by page_size",
        "make chunked-prefill-size a multiple of page-size.",
        _CHECK,
        "arg_groups/validation_hook.py:244",
    ),
    StartupRule(
        "pdmux-in-pd",
        "enable-pdmux",
        given_all("enable-pdmux"),
        "PD-Multiplexing is not compatible with disaggregation mode.",
        "remove enable-pdmux: it multiplexes prefill and decode on one server, which PD splits.",
        _CHECK,
        "arg_groups/validation_hook.py:256",
    ),
    positive(
        "tokenizer-worker-num",
        "Tokenizer worker num must >= 1",
        _CHECK,
        "arg_groups/validation_hook.py:273",
    ),
    positive(
        "detokenizer-worker-num",
        "Detokenizer worker num must >= 1",
        _CHECK,
        "arg_groups/validation_hook.py:274",
    ),
    nonnegative(
        "mm-processor-worker-num",
        "Multimodal processor worker num must >= 0",
        _CHECK,
        "arg_groups/validation_hook.py:275",
    ),
    nonnegative(
        "mm-io-worker-num",
        "Multimodal I/O worker num must >= 0",
        _CHECK,
        "arg_groups/validation_hook.py:276",
    ),
    StartupRule(
        "priority-scheduling-policy",
        "enable-priority-scheduling",
        lambda v: (
            v.on("enable-priority-scheduling") and v.text("schedule-policy") not in ("fcfs", "lof")
        ),
        "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'.",
        "set schedule-policy to fcfs or lof.",
        _CHECK,
        "arg_groups/validation_hook.py:282",
    ),
    StartupRule(
        "priority-retraction-without-priority-scheduling",
        "retraction-policy",
        lambda v: (
            v.text("retraction-policy") == "priority" and not v.on("enable-priority-scheduling")
        ),
        "--retraction-policy priority requires --enable-priority-scheduling",
        "add enable-priority-scheduling: true, or use retraction-policy: length.",
        _CHECK,
        "arg_groups/validation_hook.py:304",
    ),
    nonnegative(
        "schedule-conservativeness",
        "schedule_conservativeness must be non-negative",
        _CHECK,
        "arg_groups/validation_hook.py:314",
    ),
    StartupRule(
        "metrics-file-without-dir",
        "export-metrics-to-file",
        without("export-metrics-to-file", "export-metrics-to-file-dir"),
        "--export-metrics-to-file-dir is required when --export-metrics-to-file is enabled",
        "add export-metrics-to-file-dir.",
        _CHECK,
        "arg_groups/validation_hook.py:341",
    ),
    StartupRule(
        "two-batch-overlap-without-attention-dp",
        "enable-two-batch-overlap",
        lambda v: (
            v.on("enable-two-batch-overlap")
            and v.text("moe-a2a-backend") in (None, "none")
            and not _attention_dp(v)
        ),
        "When enabling two batch overlap without an EP a2a backend (moe_a2a_backend='none'), "
        "attention DP (--attn-dp-size) is required",
        "set moe-a2a-backend, or give the role dp > 1 with dp_attention: true.",
        _CHECK,
        "arg_groups/validation_hook.py:768",
    ),
    StartupRule(
        "quant-communications-with-tp-1",
        "enable-quant-communications",
        lambda v: v.on("enable-quant-communications") and v.size("tp-size") == 1,
        "Communications quantization is only used with tp_size != 1",
        "remove enable-quant-communications.",
        _CHECK,
        "arg_groups/validation_hook.py:350",
    ),
    StartupRule(
        "quant-communications-not-npu",
        "enable-quant-communications",
        lambda v: v.on("enable-quant-communications") and v.text("device") != "npu",
        "Communications quantization is only supported for NPU device",
        "remove enable-quant-communications (Ascend NPUs only).",
        _CHECK,
        "arg_groups/validation_hook.py:353",
    ),
    StartupRule(
        "gc-threshold-size",
        "gc-threshold",
        _gc_threshold_size,
        "When setting gc_threshold, it must contain 1 to 3 integers.",
        "give gc-threshold 1 to 3 integers.",
        _CHECK,
        "arg_groups/validation_hook.py:370",
    ),
    StartupRule(
        "kv-canary-sweep-without-canary",
        "kv-canary-sweep-interval",
        lambda v: (v.number("kv-canary-sweep-interval") or 0) > 0 and v.text("kv-canary") == "none",
        "--kv-canary-sweep-interval requires --kv-canary in {{log, raise}}",
        "set kv-canary to log or raise, or remove kv-canary-sweep-interval.",
        _CHECK,
        "arg_groups/validation_hook.py:375",
    ),
    StartupRule(
        "watermark-config-without-watermark",
        "watermark-config",
        without("watermark-config", "enable-watermark"),
        "--watermark-config requires --enable-watermark",
        "remove watermark-config (watermarking is not available with PD).",
        _CHECK,
        "arg_groups/validation_hook.py:37",
    ),
    StartupRule(
        "watermark-in-pd",
        "enable-watermark",
        given_all("enable-watermark"),
        "--enable-watermark is not supported with PD disaggregation",
        "remove enable-watermark.",
        _CHECK,
        "arg_groups/validation_hook.py:89",
    ),
    positive(
        "max-loras-per-batch",
        "max_loras_per_batch must be positive",
        _CHECK,
        "arg_groups/lora_hook.py:36",
    ),
    # The KV cache is sized from the memory left after the weights load, on the GPU: SGLang has
    # no range check for mem-fraction-static, it fails there.
    StartupRule(
        "mem-fraction-static-not-positive",
        "mem-fraction-static",
        at_most("mem-fraction-static", 0),
        "Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static={mem-fraction-static}.",
        "set mem-fraction-static between 0 and 1 (e.g. 0.85), or remove it so SGLang picks one.",
        "",
        "mem_cache/kv_cache_configurator.py:3044",
        needs_gpu=True,
    ),
    StartupRule(
        "mem-fraction-static-whole-gpu",
        "mem-fraction-static",
        lambda v: (v.number("mem-fraction-static") or 0) >= 1,
        "--mem-fraction-static {mem-fraction-static} leaves no GPU memory outside the weights and "
        "the KV cache, so the server runs out of memory while it starts",
        "set mem-fraction-static below 1 (e.g. 0.85), or remove it so SGLang picks one.",
        "",
        "mem_cache/kv_cache_configurator.py:3007",
        needs_gpu=True,
    ),
)
