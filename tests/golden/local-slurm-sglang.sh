# pdkit plan 'local-slurm-sglang': engine sglang, SGLang 0.5.23, model <repo>/.pdkit/models/tiny-llama, transfer mooncake_tcp

## host node0 (198.18.0.1)
# prefill-0 (prefill): CPU, HTTP :30000, bootstrap :8998, nccl :30500
MC_TCP_BIND_ADDRESS=198.18.0.1 MC_TCP_ENABLE_CONNECTION_POOL=true MOONCAKE_PROTOCOL=tcp NO_PROXY=198.18.0.1,127.0.0.1,localhost SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0 SGLANG_HOST_IP=198.18.0.1 SGLANG_USE_CPU_ENGINE=1 no_proxy=198.18.0.1,127.0.0.1,localhost <repo>/.venv-sglang-cpu/bin/python -m sglang.launch_server \
  --model-path <repo>/.pdkit/models/tiny-llama \
  --served-model-name tiny-llama \
  --host 198.18.0.1 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --device cpu \
  --nccl-port 30500 \
  --attention-backend torch_native \
  --cuda-graph-backend-decode disabled \
  --cuda-graph-backend-prefill disabled \
  --enable-metrics \
  --max-total-tokens 4096 \
  --mem-fraction-static 0.5 \
  --sleep-on-idle
# router (pdkit): :8001, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://198.18.0.1:30000 8998 \
  --decode http://198.18.0.2:30100 \
  --host 0.0.0.0 \
  --port 8001 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight \
  --prompt-tokens model:<repo>/.pdkit/models/tiny-llama

## host node1 (198.18.0.2)
# decode-0 (decode): CPU, HTTP :30100, nccl :30600
MC_TCP_BIND_ADDRESS=198.18.0.2 MC_TCP_ENABLE_CONNECTION_POOL=true MOONCAKE_PROTOCOL=tcp NO_PROXY=198.18.0.2,127.0.0.1,localhost SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0 SGLANG_HOST_IP=198.18.0.2 SGLANG_USE_CPU_ENGINE=1 no_proxy=198.18.0.2,127.0.0.1,localhost <repo>/.venv-sglang-cpu/bin/python -m sglang.launch_server \
  --model-path <repo>/.pdkit/models/tiny-llama \
  --served-model-name tiny-llama \
  --host 198.18.0.2 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --device cpu \
  --nccl-port 30600 \
  --attention-backend torch_native \
  --cuda-graph-backend-decode disabled \
  --cuda-graph-backend-prefill disabled \
  --disaggregation-decode-retraction-backup cpu_tensor \
  --enable-metrics \
  --max-total-tokens 4096 \
  --mem-fraction-static 0.5 \
  --sleep-on-idle
