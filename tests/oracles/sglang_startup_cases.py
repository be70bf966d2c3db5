"""A bad and a good topology for every start-up rule (kit/sglang/startup), shared by the unit
test (pdkit refuses the bad one at its key, accepts the good one) and the differential test
(SGLang's own hooks refuse the bad one and accept the good one).

Each case changes `base_topology()` (tests/conftest.py) by deep-merging `bad` or `good` into it;
`common` goes into both. The bad topology has exactly one problem, at `key` (by default
`<role>.args.<the rule's flag>`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import base_topology

# A file that exists wherever the tests run: SGLang checks that TLS files exist.
EXISTING_FILE = str(Path(__file__).resolve())
TLS = {"ssl-certfile": EXISTING_FILE, "ssl-keyfile": EXISTING_FILE}

# prefill_complete needs both roles on it, and attention-TP 1: SGLang 0.5.23 accepts only tp 1.
PREFILL_COMPLETE = {
    "defaults": {"args": {"disaggregation-decode-allocation-policy": "prefill_complete"}},
    "prefill": {"tp": 1},
    "decode": {"tp": 1},
}
NO_KV_CACHE = {
    "prefill-only-disable-kv-cache": True,
    "is-embedding": True,
    "chunked-prefill-size": -1,
    "disable-radix-cache": True,
}
LINKER = {"enable-unified-cache-external-linker": True}
HOST_RECEIVE = {"disaggregation-decode-host-receive-threshold": 0.5}


@dataclass(frozen=True)
class Case:
    rule: str
    role: str
    bad: dict[str, Any]
    good: dict[str, Any]
    common: dict[str, Any] = field(default_factory=dict)
    key: str | None = None

    @property
    def id(self) -> str:
        return f"{self.rule}@{self.role}"

    def topology(self, which: str) -> dict[str, Any]:
        data = base_topology()
        _merge(data, copy.deepcopy(self.common))
        _merge(data, copy.deepcopy(self.bad if which == "bad" else self.good))
        return data


def _merge(into: dict[str, Any], change: dict[str, Any]) -> None:
    for name, value in change.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        else:
            into[name] = value


def args(role: str, values: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A change that sets `values` in `role`'s args, merged with the change `more`."""
    change: dict[str, Any] = {role: {"args": values}}
    _merge(change, more)
    return change


def case(rule: str, role: str, bad: dict[str, Any], good: dict[str, Any], **kw: Any) -> Case:
    """A case whose bad and good differ only in `role`'s args."""
    return Case(rule, role, args(role, bad), args(role, good), **kw)


P, D = "prefill", "decode"

CASES: tuple[Case, ...] = (
    case(
        "hicache-host-memory-fraction-range",
        P,
        {"hicache-host-memory-fraction": 1.5},
        {"hicache-host-memory-fraction": 0.5},
    ),
    case(
        "ple-offload-with-layer-offload",
        P,
        {"ple-offload-embedding": True, "cpu-offload-gb": 4},
        {"ple-offload-embedding": True},
    ),
    case(
        "prefill-decode-interval-negative",
        P,
        {"prefill-decode-interval": -1},
        {"prefill-decode-interval": 0},
    ),
    case(
        "prefill-decode-interval-min-bs-negative",
        D,
        {"prefill-decode-interval-min-bs": -1},
        {"prefill-decode-interval-min-bs": 0},
    ),
    case(
        "response-store-in-pd", P, {"enable-response-store": True}, {"enable-response-store": False}
    ),
    case(
        "sampling-mask-max-tokens-not-positive",
        D,
        {"sampling-mask-max-tokens": 0},
        {"sampling-mask-max-tokens": 1},
    ),
    case(
        "aux-hidden-state-layers-without-capture",
        P,
        {"return-aux-hidden-state-layer-ids": [1, 2]},
        {
            "return-aux-hidden-state-layer-ids": [1, 2],
            "enable-return-aux-hidden-states": True,
            "speculative-algorithm": "EAGLE3",
        },
    ),
    case(
        "aux-hidden-state-capture-without-method",
        P,
        {"enable-return-aux-hidden-states": True},
        {"enable-return-aux-hidden-states": True, "speculative-algorithm": "EAGLE3"},
    ),
    case(
        "mm-preprocess-cache-size-mb-negative",
        P,
        {"mm-preprocess-cache-size-mb": -1},
        {"mm-preprocess-cache-size-mb": 0},
    ),
    case("ssl-keyfile-without-certfile", P, {"ssl-keyfile": EXISTING_FILE}, TLS),
    case("ssl-certfile-without-keyfile", P, {"ssl-certfile": EXISTING_FILE}, TLS),
    case(
        "ssl-ca-certs-without-tls",
        P,
        {"ssl-ca-certs": EXISTING_FILE},
        {"ssl-ca-certs": EXISTING_FILE, **TLS},
    ),
    case(
        "ssl-keyfile-password-without-tls",
        P,
        {"ssl-keyfile-password": "secret"},
        {"ssl-keyfile-password": "secret", **TLS},
    ),
    case(
        "ssl-refresh-without-tls",
        D,
        {"enable-ssl-refresh": True},
        {"enable-ssl-refresh": True, **TLS},
    ),
    case(
        "http-worker-reuseport-single-worker",
        P,
        {"enable-http-worker-reuseport": True},
        {"enable-http-worker-reuseport": True, "tokenizer-worker-num": 2},
    ),
    case(
        "http2-max-concurrent-streams-range",
        P,
        {"enable-http2": True, "http2-max-concurrent-streams": 0},
        {"enable-http2": True, "http2-max-concurrent-streams": 100},
    ),
    case(
        "http2-window-range",
        P,
        {"enable-http2": True, "http2-initial-connection-window-size": 512},
        {"enable-http2": True, "http2-initial-connection-window-size": 65536},
    ),
    case(
        "asr-max-buffer-seconds-not-positive",
        P,
        {"asr-max-buffer-seconds": 0},
        {"asr-max-buffer-seconds": 1},
    ),
    case(
        "asr-max-concurrent-sessions-not-positive",
        P,
        {"asr-max-concurrent-sessions": 0},
        {"asr-max-concurrent-sessions": 1},
    ),
    case(
        "fast-image-processor-backend-conflict",
        P,
        {"disable-fast-image-processor": True, "image-processor-backend": "torchvision"},
        {"disable-fast-image-processor": True, "image-processor-backend": "pil"},
    ),
    case(
        "grpc-response-timeout-secs-not-positive",
        P,
        {"grpc-response-timeout-secs": 0},
        {"grpc-response-timeout-secs": 1},
    ),
    case("grpc-port-range", P, {"grpc-port": 70000}, {"grpc-port": 50051}),
    case(
        "sidecar-args-without-sidecar",
        P,
        {"sidecar-args": '["--verbose"]'},
        {"sidecar-args": '["--verbose"]', "sidecar": "tracer", "grpc-port": 50051},
    ),
    case(
        "sidecar-empty",
        P,
        {"sidecar": " ", "grpc-port": 50051},
        {"sidecar": "tracer", "grpc-port": 50051},
    ),
    case(
        "sidecar-with-legacy-grpc",
        P,
        {"sidecar": "tracer", "grpc-mode": True},
        {"sidecar": "tracer", "grpc-port": 50051},
    ),
    case(
        "sidecar-without-grpc-port",
        P,
        {"sidecar": "tracer"},
        {"sidecar": "tracer", "grpc-port": 50051},
    ),
    case("grpc-port-with-ray", P, {"grpc-port": 50051, "use-ray": True}, {"grpc-port": 50051}),
    case(
        "grpc-port-with-tokenizer-workers",
        D,
        {"grpc-port": 50051, "tokenizer-worker-num": 2},
        {"grpc-port": 50051},
    ),
    Case(
        "prefill-complete-attention-tp",
        P,
        {P: {"tp": 2, "dp": 2, "dp_attention": True}},
        {P: {"tp": 1}},
        common=PREFILL_COMPLETE,
        key="defaults.args.disaggregation-decode-allocation-policy",
    ),
    case(
        "prefill-complete-prefill-attn-cp",
        P,
        {"attn-cp-size": 2},
        {"attn-cp-size": 1},
        common=PREFILL_COMPLETE,
    ),
    case("prefill-complete-dcp", D, {"dcp-size": 2}, {"dcp-size": 1}, common=PREFILL_COMPLETE),
    case(
        "prefill-complete-pdmux",
        P,
        {"enable-pdmux": True},
        {"enable-pdmux": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-decoupled-spec",
        P,
        {"decoupled-spec-role": "verifier"},
        {"decoupled-spec-role": "null"},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-role-switch",
        D,
        {"enable-pd-role-switch": True},
        {"enable-pd-role-switch": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-encoder-only",
        P,
        {"encoder-only": True},
        {"encoder-only": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-language-only",
        P,
        {"language-only": True},
        {"language-only": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-hisparse",
        D,
        {"enable-hisparse": True},
        {"enable-hisparse": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-host-receive",
        D,
        HOST_RECEIVE,
        {"disaggregation-decode-host-receive-threshold": 1},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-decode-radix-cache",
        D,
        {"disaggregation-decode-enable-radix-cache": True},
        {"disaggregation-decode-enable-radix-cache": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-decode-hicache",
        D,
        {"enable-hierarchical-cache": True},
        {"enable-hierarchical-cache": False},
        common=PREFILL_COMPLETE,
    ),
    case(
        "prefill-complete-prefill-hicache",
        P,
        {"enable-hierarchical-cache": True},
        {"enable-hierarchical-cache": True, "hicache-write-policy": "write_back"},
        common=PREFILL_COMPLETE,
    ),
    case(
        "decode-host-receive-threshold-range",
        D,
        {"disaggregation-decode-host-receive-threshold": 1.5},
        HOST_RECEIVE,
    ),
    case(
        "decode-host-receive-with-hisparse-or-role-switch",
        D,
        {**HOST_RECEIVE, "enable-pd-role-switch": True},
        HOST_RECEIVE,
    ),
    case(
        "decode-host-receive-with-cpu-tensor-backup",
        D,
        {**HOST_RECEIVE, "disaggregation-decode-retraction-backup": "cpu_tensor"},
        {**HOST_RECEIVE, "disaggregation-decode-retraction-backup": "host_pool"},
    ),
    case(
        "decode-radix-cache-with-hisparse",
        D,
        {"disaggregation-decode-enable-radix-cache": True, "enable-hisparse": True},
        {"disaggregation-decode-enable-radix-cache": True},
    ),
    case(
        "pd-role-switch-unsupported-features",
        P,
        {"enable-pd-role-switch": True, "dcp-size": 2},
        {"enable-pd-role-switch": True, "dcp-size": 1},
    ),
    Case(
        "pd-role-switch-unsupported-features",
        D,
        args(D, {"enable-pd-role-switch": True}),
        args(D, {"enable-pd-role-switch": True}, decode={"ep": 1}),
        common={D: {"ep": 4}},
    ),
    case(
        "prefill-only-disable-kv-cache-without-embedding",
        P,
        {**NO_KV_CACHE, "is-embedding": False},
        NO_KV_CACHE,
    ),
    case(
        "prefill-only-disable-kv-cache-chunked",
        P,
        {**NO_KV_CACHE, "chunked-prefill-size": None},
        NO_KV_CACHE,
    ),
    case(
        "prefill-only-disable-kv-cache-radix",
        P,
        {**NO_KV_CACHE, "disable-radix-cache": False},
        NO_KV_CACHE,
    ),
    case(
        "prefill-only-disable-kv-cache-attn-cp", P, {**NO_KV_CACHE, "attn-cp-size": 2}, NO_KV_CACHE
    ),
    # kv-cache-dtype must agree between the roles, so it goes under defaults.
    Case(
        "prefill-only-disable-kv-cache-fp4",
        P,
        {P: {"args": NO_KV_CACHE}, "defaults": {"args": {"kv-cache-dtype": "nvfp4"}}},
        {P: {"args": NO_KV_CACHE}, "defaults": {"args": {"kv-cache-dtype": "fp8_e4m3"}}},
        key="prefill.args.prefill-only-disable-kv-cache",
    ),
    Case(
        "prefill-only-disable-kv-cache-mxfp8",
        P,
        {P: {"args": NO_KV_CACHE}, "defaults": {"args": {"kv-cache-dtype": "mxfp8"}}},
        {P: {"args": NO_KV_CACHE}, "defaults": {"args": {"kv-cache-dtype": "fp8_e4m3"}}},
        key="prefill.args.prefill-only-disable-kv-cache",
    ),
    case("dcp-size-below-one", D, {"dcp-size": 0}, {"dcp-size": 1}),
    case("dcp-with-prefill-cp", D, {"dcp-size": 2, "enable-prefill-cp": True}, {"dcp-size": 2}),
    case(
        "dcp-comm-backend-without-dcp",
        D,
        {"dcp-comm-backend": "a2a"},
        {"dcp-comm-backend": "ag_rs"},
    ),
    case(
        "dcp-replicate-q-proj-without-dcp",
        D,
        {"dcp-replicate-q-proj": True},
        {"dcp-replicate-q-proj": True, "dcp-size": 2, "dcp-comm-backend": "a2a"},
    ),
    case(
        "dcp-replicate-q-proj-with-ag-rs",
        D,
        {"dcp-replicate-q-proj": True, "dcp-size": 2, "dcp-comm-backend": "ag_rs"},
        {"dcp-replicate-q-proj": True, "dcp-size": 2, "dcp-comm-backend": "a2a"},
    ),
    case("dwdp-size-not-tp", P, {"dwdp-size": 4}, {"dwdp-size": 2}),
    case("dwdp-on-decode", D, {"dwdp-size": 4}, {"dwdp-size": 1}),
    case("dwdp-with-eplb", P, {"dwdp-size": 2, "enable-eplb": True}, {"dwdp-size": 2}),
    case(
        "dwdp-with-speculative",
        P,
        {"dwdp-size": 2, "speculative-algorithm": "EAGLE"},
        {"dwdp-size": 2},
    ),
    case("dwdp-with-pp", P, {"dwdp-size": 2}, {"dwdp-size": 1}, common={P: {"pp": 2}}),
    case(
        "dwdp-with-two-batch-overlap",
        P,
        {"dwdp-size": 2, "enable-two-batch-overlap": True},
        {"dwdp-size": 2},
    ),
    case(
        "linker-mla-dedup-without-mooncake-linker",
        P,
        {"enable-linker-mla-dedup": True},
        {"enable-linker-mla-dedup": True, **LINKER},
    ),
    case("external-linker-without-radix-cache", P, {**LINKER, "disable-radix-cache": True}, LINKER),
    case(
        "external-linker-without-radix-cache",
        D,
        LINKER,
        {**LINKER, "disaggregation-decode-enable-radix-cache": True},
    ),
    case("external-linker-with-hicache", P, {**LINKER, "enable-hierarchical-cache": True}, LINKER),
    case(
        "external-linker-with-hicache-storage",
        P,
        {**LINKER, "hicache-storage-backend": "file"},
        LINKER,
    ),
    case(
        "hicache-buffer-only-without-storage",
        P,
        {"enable-hierarchical-cache": True, "hicache-host-memory-mode": "buffer_only"},
        {
            "enable-hierarchical-cache": True,
            "hicache-host-memory-mode": "buffer_only",
            "hicache-storage-backend": "file",
        },
    ),
    case(
        "hicache-buffer-only-without-storage",
        D,
        {"hicache-host-memory-mode": "buffer_only"},
        {"hicache-host-memory-mode": "cache"},
    ),
    case(
        "hicache-buffer-only-on-decode",
        D,
        {"hicache-host-memory-mode": "buffer_only", "hicache-storage-backend": "file"},
        {"hicache-host-memory-mode": "cache", "hicache-storage-backend": "file"},
    ),
    case(
        "prefix-mm-cache-without-encoder-only",
        P,
        {"enable-prefix-mm-cache": True},
        {"enable-prefix-mm-cache": False},
    ),
    case(
        "encoder-only-with-language-only",
        P,
        {"encoder-only": True, "language-only": True},
        {"language-only": True},
    ),
    case("encoder-only-in-pd", D, {"encoder-only": True}, {"encoder-only": False}),
    case(
        "tokenizer-batch-encode-with-dynamic-batching",
        P,
        {"enable-tokenizer-batch-encode": True, "enable-dynamic-batch-tokenizer": True},
        {"enable-tokenizer-batch-encode": True},
    ),
    case(
        "default-chat-template-kwargs-not-object",
        P,
        {"default-chat-template-kwargs": '["enable_thinking"]'},
        {"default-chat-template-kwargs": '{"enable_thinking": false}'},
    ),
    case(
        "pp-max-micro-batch-size-not-positive",
        P,
        {"pp-max-micro-batch-size": 0},
        {"pp-max-micro-batch-size": 1},
    ),
    case(
        "cuda-graph-padding-off-with-torch-compile",
        D,
        {"disable-cuda-graph-padding": True, "enable-torch-compile": True},
        {"disable-cuda-graph-padding": True},
    ),
    case("gpu-id-step-not-positive", P, {"gpu-id-step": 0}, {"gpu-id-step": 1}),
    case("moe-dense-tp-size-values", P, {"moe-dense-tp-size": 4}, {"moe-dense-tp-size": 2}),
    Case(
        "served-model-name-colon",
        P,
        {"model": {"served_name": "llama:8b"}},
        {"model": {"served_name": "llama-8b"}},
        key="model.served_name",
    ),
    case(
        "chunked-prefill-not-page-multiple",
        P,
        {"chunked-prefill-size": 100},
        {"chunked-prefill-size": 128},
        common={"defaults": {"args": {"page-size": 64}}},
    ),
    case(
        "pdmux-in-pd",
        P,
        {"enable-pdmux": True, "chunked-prefill-size": -1},
        {"chunked-prefill-size": -1},
    ),
    case(
        "tokenizer-worker-num-not-positive",
        P,
        {"tokenizer-worker-num": 0},
        {"tokenizer-worker-num": 1},
    ),
    case(
        "detokenizer-worker-num-not-positive",
        D,
        {"detokenizer-worker-num": 0},
        {"detokenizer-worker-num": 1},
    ),
    case(
        "mm-processor-worker-num-negative",
        P,
        {"mm-processor-worker-num": -1},
        {"mm-processor-worker-num": 0},
    ),
    case("mm-io-worker-num-negative", P, {"mm-io-worker-num": -1}, {"mm-io-worker-num": 0}),
    case(
        "priority-scheduling-policy",
        P,
        {"enable-priority-scheduling": True, "schedule-policy": "lpm"},
        {"enable-priority-scheduling": True, "schedule-policy": "fcfs"},
    ),
    case(
        "priority-retraction-without-priority-scheduling",
        D,
        {"retraction-policy": "priority"},
        {"retraction-policy": "priority", "enable-priority-scheduling": True},
    ),
    case(
        "schedule-conservativeness-negative",
        P,
        {"schedule-conservativeness": -0.5},
        {"schedule-conservativeness": 0.3},
    ),
    case(
        "metrics-file-without-dir",
        P,
        {"export-metrics-to-file": True},
        {"export-metrics-to-file": True, "export-metrics-to-file-dir": "/var/tmp/metrics"},
    ),
    case(
        "two-batch-overlap-without-attention-dp",
        P,
        {"enable-two-batch-overlap": True},
        {"enable-two-batch-overlap": True, "moe-a2a-backend": "deepep"},
    ),
    Case(
        "two-batch-overlap-without-attention-dp",
        D,
        args(D, {"enable-two-batch-overlap": True}),
        args(D, {"enable-two-batch-overlap": True}, decode={"dp": 4, "dp_attention": True}),
    ),
    case(
        "quant-communications-with-tp-1",
        P,
        {"enable-quant-communications": True},
        {"enable-quant-communications": False},
        common={P: {"tp": 1}},
    ),
    case(
        "quant-communications-not-npu",
        P,
        {"enable-quant-communications": True},
        {"enable-quant-communications": False},
    ),
    case("gc-threshold-size", P, {"gc-threshold": [700, 10, 10, 5]}, {"gc-threshold": [700, 10]}),
    case(
        "kv-canary-sweep-without-canary",
        P,
        {"kv-canary-sweep-interval": 10},
        {"kv-canary-sweep-interval": 10, "kv-canary": "log"},
    ),
    case(
        "watermark-config-without-watermark",
        P,
        {"watermark-config": '{"context_window": 4}'},
        {"watermark-config": None},
    ),
    case("watermark-in-pd", D, {"enable-watermark": True}, {"enable-watermark": False}),
    case(
        "max-loras-per-batch-not-positive",
        P,
        {"max-loras-per-batch": 0},
        {"max-loras-per-batch": 1},
    ),
    case(
        "mem-fraction-static-not-positive",
        P,
        {"mem-fraction-static": 0},
        {"mem-fraction-static": 0.85},
    ),
    case(
        "mem-fraction-static-whole-gpu",
        D,
        {"mem-fraction-static": 1.0},
        {"mem-fraction-static": 0.85},
    ),
)
