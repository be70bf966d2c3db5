# pdkit plan 'local': engine sim, SGLang 0.5.23, model meta-llama/Llama-3.1-8B-Instruct, transfer mooncake_tcp

## host localhost (127.0.0.1)
# prefill-0 (prefill): GPUs 0, HTTP :30000, bootstrap :8998, nccl :30500
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=127.0.0.1 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 127.0.0.1 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --nccl-port 30500 \
  --enable-metrics \
  --page-size 16
# prefill-1 (prefill): GPUs 1, HTTP :30001, bootstrap :8999, nccl :30501
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=127.0.0.1 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 127.0.0.1 \
  --port 30001 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8999 \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --base-gpu-id 1 \
  --nccl-port 30501 \
  --enable-metrics \
  --page-size 16
# decode-0 (decode): GPUs 2, HTTP :30100, nccl :30600
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=127.0.0.1 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 127.0.0.1 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --base-gpu-id 2 \
  --nccl-port 30600 \
  --enable-metrics \
  --max-running-requests 256 \
  --page-size 16
# router (pdkit): :8000, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://127.0.0.1:30000 8998 \
  --prefill http://127.0.0.1:30001 8999 \
  --decode http://127.0.0.1:30100 \
  --host 127.0.0.1 \
  --port 8000 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight \
  --hold-timeout 90 \
  --prompt-tokens sim
