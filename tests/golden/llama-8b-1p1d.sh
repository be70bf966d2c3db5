# pdkit plan 'llama-8b-1p1d': engine sglang, SGLang 0.5.23, model meta-llama/Llama-3.1-8B-Instruct, transfer mooncake

## host gpu-node (10.0.0.1)
# prefill-0 (prefill): GPUs 0, HTTP :30000, bootstrap :8998, nccl :30500
MC_GID_INDEX=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.0.1 python -m sglang.launch_server \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --host 10.0.0.1 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_roce0 \
  --tp-size 1 \
  --nccl-port 30500 \
  --enable-metrics
# decode-0 (decode): GPUs 7, HTTP :30001, nccl :30600
MC_GID_INDEX=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.0.1 python -m sglang.launch_server \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --host 10.0.0.1 \
  --port 30001 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_roce0 \
  --tp-size 1 \
  --base-gpu-id 7 \
  --nccl-port 30600 \
  --enable-metrics
# router (pdkit): :8000, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://10.0.0.1:30000 8998 \
  --decode http://10.0.0.1:30001 \
  --host 0.0.0.0 \
  --port 8000 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight
