"""Start-up rules of SGLang 0.5.22: 0.5.23's table (v0_5_23.py) at 0.5.22's source lines,
less the checks 0.5.22 does not have.

Made with `python -m tools.review_startup_rules --base 0.5.23 --srt <0.5.22's sglang/srt>` and
reviewed by hand against 0.5.22's hooks (`arg_groups/*_hook.py`): every message below is
0.5.22's own; two the tool could not place were placed by reading the source
(dcp-comm-backend-without-dcp, mem-fraction-static-whole-gpu). Attention DP has the same
spelling in both versions (`--attn-dp-size`; `--enable-dp-attention` deprecated in both).
"""

from __future__ import annotations

from dataclasses import replace

from kit.sglang.startup import v0_5_23
from kit.sglang.startup.rules import StartupRule

ABSENT: dict[str, str] = {
    # Flags 0.5.22 does not have (its catalog lacks them).
    "prefill-decode-interval-min-bs-negative": "no --prefill-decode-interval-min-bs",
    "aux-hidden-state-layers-without-capture": "no --return-aux-hidden-state-layer-ids",
    "aux-hidden-state-capture-without-method": "no --enable-return-aux-hidden-states",
    "http-worker-reuseport-single-worker": "no --enable-http-worker-reuseport",
}
"""0.5.23's rules 0.5.22 does not check -> why."""

SOURCES: dict[str, str] = {
    "hicache-host-memory-fraction-range": "arg_groups/hicache_hook.py:98",
    "prefill-decode-interval-negative": "arg_groups/validation_hook.py:659",
    "response-store-in-pd": "arg_groups/validation_hook.py:111",
    "sampling-mask-max-tokens-not-positive": "arg_groups/validation_hook.py:685",
    "mm-preprocess-cache-size-mb-negative": "arg_groups/serving_hook.py:138",
    "http2-max-concurrent-streams-range": "arg_groups/serving_hook.py:91",
    "http2-window-range": "arg_groups/serving_hook.py:95",
    "asr-max-buffer-seconds-not-positive": "arg_groups/serving_hook.py:120",
    "asr-max-concurrent-sessions-not-positive": "arg_groups/serving_hook.py:125",
    "fast-image-processor-backend-conflict": "arg_groups/serving_hook.py:253",
    "grpc-response-timeout-secs-not-positive": "arg_groups/serving_hook.py:353",
    "grpc-port-range": "arg_groups/serving_hook.py:357",
    "sidecar-args-without-sidecar": "arg_groups/serving_hook.py:371",
    "sidecar-empty": "arg_groups/serving_hook.py:378",
    "sidecar-with-legacy-grpc": "arg_groups/serving_hook.py:380",
    "sidecar-without-grpc-port": "arg_groups/serving_hook.py:385",
    "grpc-port-with-ray": "arg_groups/serving_hook.py:393",
    "grpc-port-with-tokenizer-workers": "arg_groups/serving_hook.py:403",
    "prefill-complete-attention-tp": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-prefill-attn-cp": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-dcp": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-pdmux": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-decoupled-spec": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-role-switch": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-encoder-only": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-language-only": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-hisparse": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-host-receive": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-decode-radix-cache": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-decode-hicache": "arg_groups/pd_disaggregation_hook.py:245",
    "prefill-complete-prefill-hicache": "arg_groups/pd_disaggregation_hook.py:245",
    "pd-role-switch-unsupported-features": "arg_groups/pd_disaggregation_hook.py:197",
    "prefill-only-disable-kv-cache-without-embedding": "arg_groups/kv_cache_hook.py:892",
    "prefill-only-disable-kv-cache-fp4": "arg_groups/kv_cache_hook.py:898",
    "prefill-only-disable-kv-cache-mxfp8": "arg_groups/kv_cache_hook.py:904",
    "prefill-only-disable-kv-cache-chunked": "arg_groups/kv_cache_hook.py:917",
    "prefill-only-disable-kv-cache-radix": "arg_groups/kv_cache_hook.py:923",
    "prefill-only-disable-kv-cache-attn-cp": "arg_groups/kv_cache_hook.py:932",
    "dcp-size-below-one": "arg_groups/parallel_hook.py:238",
    "dcp-with-prefill-cp": "arg_groups/parallel_hook.py:244",
    "dcp-replicate-q-proj-without-dcp": "arg_groups/parallel_hook.py:261",
    "dcp-replicate-q-proj-with-ag-rs": "arg_groups/parallel_hook.py:263",
    "dwdp-size-not-tp": "arg_groups/parallel_hook.py:418",
    "dwdp-on-decode": "arg_groups/parallel_hook.py:421",
    "dwdp-with-eplb": "arg_groups/parallel_hook.py:425",
    "dwdp-with-speculative": "arg_groups/parallel_hook.py:428",
    "dwdp-with-pp": "arg_groups/parallel_hook.py:431",
    "dwdp-with-two-batch-overlap": "arg_groups/parallel_hook.py:432",
    "linker-mla-dedup-without-mooncake-linker": "arg_groups/hicache_hook.py:30",
    "external-linker-without-radix-cache": "arg_groups/hicache_hook.py:33",
    "external-linker-with-hicache": "arg_groups/hicache_hook.py:33",
    "external-linker-with-hicache-storage": "arg_groups/hicache_hook.py:33",
    "hicache-buffer-only-without-storage": "arg_groups/hicache_hook.py:232",
    "hicache-buffer-only-on-decode": "arg_groups/hicache_hook.py:249",
    "prefix-mm-cache-without-encoder-only": "arg_groups/pd_disaggregation_hook.py:297",
    "encoder-only-with-language-only": "arg_groups/pd_disaggregation_hook.py:301",
    "encoder-only-in-pd": "arg_groups/pd_disaggregation_hook.py:303",
    "tokenizer-batch-encode-with-dynamic-batching": "arg_groups/serving_hook.py:736",
    "default-chat-template-kwargs-not-object": "arg_groups/serving_hook.py:480",
    "pp-max-micro-batch-size-not-positive": "arg_groups/validation_hook.py:182",
    "cuda-graph-padding-off-with-torch-compile": "arg_groups/validation_hook.py:187",
    "gpu-id-step-not-positive": "arg_groups/validation_hook.py:204",
    "moe-dense-tp-size-values": "arg_groups/validation_hook.py:206",
    "served-model-name-colon": "arg_groups/validation_hook.py:214",
    "chunked-prefill-not-page-multiple": "arg_groups/validation_hook.py:243",
    "pdmux-in-pd": "arg_groups/validation_hook.py:255",
    "tokenizer-worker-num-not-positive": "arg_groups/validation_hook.py:272",
    "detokenizer-worker-num-not-positive": "arg_groups/validation_hook.py:273",
    "mm-processor-worker-num-negative": "arg_groups/validation_hook.py:274",
    "mm-io-worker-num-negative": "arg_groups/validation_hook.py:275",
    "priority-scheduling-policy": "arg_groups/validation_hook.py:281",
    "priority-retraction-without-priority-scheduling": "arg_groups/validation_hook.py:303",
    "schedule-conservativeness-negative": "arg_groups/validation_hook.py:313",
    "metrics-file-without-dir": "arg_groups/validation_hook.py:340",
    "two-batch-overlap-without-attention-dp": "arg_groups/validation_hook.py:703",
    "quant-communications-with-tp-1": "arg_groups/validation_hook.py:349",
    "quant-communications-not-npu": "arg_groups/validation_hook.py:352",
    "gc-threshold-size": "arg_groups/validation_hook.py:369",
    "kv-canary-sweep-without-canary": "arg_groups/validation_hook.py:374",
    "watermark-config-without-watermark": "arg_groups/validation_hook.py:36",
    "watermark-in-pd": "arg_groups/validation_hook.py:88",
    "max-loras-per-batch-not-positive": "arg_groups/lora_hook.py:22",
    "mem-fraction-static-not-positive": "mem_cache/kv_cache_configurator.py:2725",
    "dcp-comm-backend-without-dcp": "arg_groups/parallel_hook.py:246",
    "mem-fraction-static-whole-gpu": "mem_cache/kv_cache_configurator.py:2688",
}
"""Rule -> the file:line under sglang/srt where 0.5.22 raises it, where it moved."""

RULES: tuple[StartupRule, ...] = tuple(
    replace(rule, source=SOURCES.get(rule.name, rule.source))
    for rule in v0_5_23.RULES
    if rule.name not in ABSENT
)
