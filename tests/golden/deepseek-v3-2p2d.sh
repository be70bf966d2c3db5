# pdkit plan 'deepseek-v3-2p2d': engine sglang, SGLang 0.5.23, model deepseek-ai/DeepSeek-V3, transfer mooncake

## host prefill-0 (10.0.1.10)
# prefill-0-node0 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 0 of 2, dist-init 10.0.1.10:5000, under its rank group's agent (kit.ranks, leader 10.0.1.10:5040)
GLOO_SOCKET_IFNAME=eth0 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=eth0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.1.10 SGLANG_ZMQ_ALLOWED_PEERS=10.0.1.10,10.0.1.11 SGLANG_ZMQ_SOURCE_IP=10.0.1.10 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-V3 \
  --trust-remote-code \
  --host 10.0.1.10 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --tp-size 16 \
  --attn-dp-size 8 \
  --dist-init-addr 10.0.1.10:5000 \
  --nnodes 2 \
  --node-rank 0 \
  --nccl-port 30500 \
  --dist-timeout 3600 \
  --enable-metrics \
  --mem-fraction-static 0.8 \
  --moe-a2a-backend deepep \
  --watchdog-timeout 3600
# router (pdkit): :8000, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://10.0.1.10:30000 8998 \
  --decode http://10.0.1.20:30001 \
  --host 0.0.0.0 \
  --port 8000 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight \
  --hold-timeout 300

## host prefill-1 (10.0.1.11)
# prefill-0-node1 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 1 of 2, dist-init 10.0.1.10:5000, under its rank group's agent (kit.ranks, leader 10.0.1.10:5040)
GLOO_SOCKET_IFNAME=eth0 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=eth0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.1.11 SGLANG_ZMQ_ALLOWED_PEERS=10.0.1.10,10.0.1.11 SGLANG_ZMQ_SOURCE_IP=10.0.1.11 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-V3 \
  --trust-remote-code \
  --host 10.0.1.11 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --tp-size 16 \
  --attn-dp-size 8 \
  --dist-init-addr 10.0.1.10:5000 \
  --nnodes 2 \
  --node-rank 1 \
  --nccl-port 30500 \
  --dist-timeout 3600 \
  --enable-metrics \
  --mem-fraction-static 0.8 \
  --moe-a2a-backend deepep \
  --watchdog-timeout 3600

## host decode-0 (10.0.1.20)
# decode-0-node0 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30001, nccl :30600, node 0 of 2, dist-init 10.0.1.20:5000, under its rank group's agent (kit.ranks, leader 10.0.1.20:5040)
GLOO_SOCKET_IFNAME=eth0 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=eth0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.1.20 SGLANG_ZMQ_ALLOWED_PEERS=10.0.1.20,10.0.1.21 SGLANG_ZMQ_SOURCE_IP=10.0.1.20 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-V3 \
  --trust-remote-code \
  --host 10.0.1.20 \
  --port 30001 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --tp-size 16 \
  --attn-dp-size 8 \
  --dist-init-addr 10.0.1.20:5000 \
  --nnodes 2 \
  --node-rank 0 \
  --nccl-port 30600 \
  --dist-timeout 3600 \
  --enable-metrics \
  --max-running-requests 128 \
  --mem-fraction-static 0.8 \
  --moe-a2a-backend deepep \
  --watchdog-timeout 3600

## host decode-1 (10.0.1.21)
# decode-0-node1 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30001, nccl :30600, node 1 of 2, dist-init 10.0.1.20:5000, under its rank group's agent (kit.ranks, leader 10.0.1.20:5040)
GLOO_SOCKET_IFNAME=eth0 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=eth0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300 SGLANG_HOST_IP=10.0.1.21 SGLANG_ZMQ_ALLOWED_PEERS=10.0.1.20,10.0.1.21 SGLANG_ZMQ_SOURCE_IP=10.0.1.21 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-V3 \
  --trust-remote-code \
  --host 10.0.1.21 \
  --port 30001 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --tp-size 16 \
  --attn-dp-size 8 \
  --dist-init-addr 10.0.1.20:5000 \
  --nnodes 2 \
  --node-rank 1 \
  --nccl-port 30600 \
  --dist-timeout 3600 \
  --enable-metrics \
  --max-running-requests 128 \
  --mem-fraction-static 0.8 \
  --moe-a2a-backend deepep \
  --watchdog-timeout 3600
