# pdkit plan 'local-slurm': engine sim, SGLang 0.5.23, model meta-llama/Llama-3.1-8B-Instruct, transfer mooncake_tcp

## host node0 (198.18.0.1)
# prefill-0 (prefill): GPUs 0, HTTP :30000, bootstrap :8998, nccl :30500
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=198.18.0.1 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 198.18.0.1 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --nccl-port 30500 \
  --enable-metrics \
  --page-size 16
# prefill-1 (prefill): GPUs 1, HTTP :30001, bootstrap :8999, nccl :30501
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=198.18.0.1 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 198.18.0.1 \
  --port 30001 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8999 \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 1 \
  --base-gpu-id 1 \
  --nccl-port 30501 \
  --enable-metrics \
  --page-size 16
# router (pdkit): :8000, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://198.18.0.1:30000 8998 \
  --prefill http://198.18.0.1:30001 8999 \
  --decode http://198.18.0.2:30100 \
  --host 0.0.0.0 \
  --port 8000 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight \
  --hold-timeout 30 \
  --prompt-tokens sim

## host node1 (198.18.0.2)
# decode-0-node0 (decode): GPUs 0,1, HTTP :30100, nccl :30600, node 0 of 2, dist-init 198.18.0.2:5500
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=198.18.0.2 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 198.18.0.2 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 4 \
  --dist-init-addr 198.18.0.2:5500 \
  --nnodes 2 \
  --node-rank 0 \
  --nccl-port 30600 \
  --enable-metrics \
  --max-running-requests 256 \
  --page-size 16

## host node2 (198.18.0.3)
# decode-0-node1 (decode): GPUs 0,1, HTTP :30100, nccl :30600, node 1 of 2, dist-init 198.18.0.2:5500
PDKIT_SIM_GPU=H100-SXM SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=198.18.0.3 python -m kit.sim \
  --model-path meta-llama/Llama-3.1-8B-Instruct \
  --served-model-name llama-3.1-8b \
  --host 198.18.0.3 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake_tcp \
  --tp-size 4 \
  --dist-init-addr 198.18.0.2:5500 \
  --nnodes 2 \
  --node-rank 1 \
  --nccl-port 30600 \
  --enable-metrics \
  --max-running-requests 256 \
  --page-size 16
