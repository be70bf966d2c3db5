# pdkit plan 'qwen3-2p1d': engine sglang, SGLang 0.5.23, model Qwen/Qwen3-32B, transfer mooncake

## host gpu-a (10.0.2.1)
# prefill-0 (prefill): GPUs 0,1,2,3, HTTP :30000, bootstrap :8998, nccl :30500
MC_GID_INDEX=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.2.1 python -m sglang.launch_server \
  --model-path Qwen/Qwen3-32B \
  --served-model-name qwen3-32b \
  --host 10.0.2.1 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3"}' \
  --tp-size 4 \
  --nccl-port 30500 \
  --chunked-prefill-size 16384 \
  --enable-metrics \
  --kv-cache-dtype fp8_e4m3 \
  --page-size 64
# prefill-1 (prefill): GPUs 4,5,6,7, HTTP :30001, bootstrap :8999, nccl :30501
MC_GID_INDEX=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.2.1 python -m sglang.launch_server \
  --model-path Qwen/Qwen3-32B \
  --served-model-name qwen3-32b \
  --host 10.0.2.1 \
  --port 30001 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8999 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 4 \
  --base-gpu-id 4 \
  --nccl-port 30501 \
  --chunked-prefill-size 16384 \
  --enable-metrics \
  --kv-cache-dtype fp8_e4m3 \
  --page-size 64
# router (smg): :8000, metrics :29000, policies prefill=cache_aware decode=round_robin, API key from PDKIT_API_KEY
smg \
  launch \
  --pd-disaggregation \
  --prefill http://10.0.2.1:30000 8998 \
  --prefill http://10.0.2.1:30001 8999 \
  --decode http://10.0.2.2:30100 \
  --host 0.0.0.0 \
  --port 8000 \
  --prefill-policy cache_aware \
  --decode-policy round_robin \
  --prometheus-host 0.0.0.0 \
  --prometheus-port 29000 \
  --retry-max-retries 4 \
  --retry-initial-backoff-ms 50 \
  --cb-failure-threshold 3 \
  --cb-timeout-duration-secs 1 \
  --api-key "$PDKIT_ROUTER_API_KEY"

## host gpu-b (10.0.2.2)
# decode-0 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600
MC_GID_INDEX=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.2.2 python -m sglang.launch_server \
  --model-path Qwen/Qwen3-32B \
  --served-model-name qwen3-32b \
  --host 10.0.2.2 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 8 \
  --nccl-port 30600 \
  --enable-metrics \
  --kv-cache-dtype fp8_e4m3 \
  --max-running-requests 256 \
  --mem-fraction-static 0.85 \
  --page-size 64
