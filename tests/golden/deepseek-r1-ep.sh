# pdkit plan 'deepseek-r1-ep': engine sglang, SGLang 0.5.23, model deepseek-ai/DeepSeek-R1, transfer mooncake

## host prefill-0 (10.0.2.10)
# prefill-0-node0 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 0 of 4, dist-init 10.0.2.10:5000, under its rank group's agent (kit.ranks, leader 10.0.2.10:5040)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.10 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.10,10.0.2.11,10.0.2.12,10.0.2.13 SGLANG_ZMQ_SOURCE_IP=10.0.2.10 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.10 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 32 \
  --attn-dp-size 32 \
  --ep-size 32 \
  --dist-init-addr 10.0.2.10:5000 \
  --nnodes 4 \
  --node-rank 0 \
  --nccl-port 30500 \
  --chunked-prefill-size 524288 \
  --deepep-config /data/deepep/prefill_config.json \
  --deepep-mode normal \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-dispatch-algorithm dynamic \
  --ep-num-redundant-experts 32 \
  --eplb-algorithm deepseek \
  --init-expert-location /data/eplb/prefill_in4096.json \
  --max-total-tokens 131072 \
  --mem-fraction-static 0.85 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --page-size 1 \
  --watchdog-timeout 3600
# router (pdkit): :8000, policies prefill=prefix_affinity decode=least_inflight
python -m kit.lb \
  --prefill http://10.0.2.10:30000 8998 \
  --decode http://10.0.2.20:30100 \
  --host 0.0.0.0 \
  --port 8000 \
  --prefill-policy prefix_affinity \
  --decode-policy least_inflight \
  --prefill-timeout 200000 \
  --request-timeout 200000 \
  --hold-timeout 300

## host prefill-1 (10.0.2.11)
# prefill-0-node1 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 1 of 4, dist-init 10.0.2.10:5000, under its rank group's agent (kit.ranks, leader 10.0.2.10:5040)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.11 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.10,10.0.2.11,10.0.2.12,10.0.2.13 SGLANG_ZMQ_SOURCE_IP=10.0.2.11 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.11 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 32 \
  --attn-dp-size 32 \
  --ep-size 32 \
  --dist-init-addr 10.0.2.10:5000 \
  --nnodes 4 \
  --node-rank 1 \
  --nccl-port 30500 \
  --chunked-prefill-size 524288 \
  --deepep-config /data/deepep/prefill_config.json \
  --deepep-mode normal \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-dispatch-algorithm dynamic \
  --ep-num-redundant-experts 32 \
  --eplb-algorithm deepseek \
  --init-expert-location /data/eplb/prefill_in4096.json \
  --max-total-tokens 131072 \
  --mem-fraction-static 0.85 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --page-size 1 \
  --watchdog-timeout 3600

## host prefill-2 (10.0.2.12)
# prefill-0-node2 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 2 of 4, dist-init 10.0.2.10:5000, under its rank group's agent (kit.ranks, leader 10.0.2.10:5040)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.12 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.10,10.0.2.11,10.0.2.12,10.0.2.13 SGLANG_ZMQ_SOURCE_IP=10.0.2.12 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.12 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 32 \
  --attn-dp-size 32 \
  --ep-size 32 \
  --dist-init-addr 10.0.2.10:5000 \
  --nnodes 4 \
  --node-rank 2 \
  --nccl-port 30500 \
  --chunked-prefill-size 524288 \
  --deepep-config /data/deepep/prefill_config.json \
  --deepep-mode normal \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-dispatch-algorithm dynamic \
  --ep-num-redundant-experts 32 \
  --eplb-algorithm deepseek \
  --init-expert-location /data/eplb/prefill_in4096.json \
  --max-total-tokens 131072 \
  --mem-fraction-static 0.85 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --page-size 1 \
  --watchdog-timeout 3600

## host prefill-3 (10.0.2.13)
# prefill-0-node3 (prefill): GPUs 0,1,2,3,4,5,6,7, HTTP :30000, bootstrap :8998, nccl :30500, node 3 of 4, dist-init 10.0.2.10:5000, under its rank group's agent (kit.ranks, leader 10.0.2.10:5040)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.13 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.10,10.0.2.11,10.0.2.12,10.0.2.13 SGLANG_ZMQ_SOURCE_IP=10.0.2.13 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.13 \
  --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 32 \
  --attn-dp-size 32 \
  --ep-size 32 \
  --dist-init-addr 10.0.2.10:5000 \
  --nnodes 4 \
  --node-rank 3 \
  --nccl-port 30500 \
  --chunked-prefill-size 524288 \
  --deepep-config /data/deepep/prefill_config.json \
  --deepep-mode normal \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-dispatch-algorithm dynamic \
  --ep-num-redundant-experts 32 \
  --eplb-algorithm deepseek \
  --init-expert-location /data/eplb/prefill_in4096.json \
  --max-total-tokens 131072 \
  --mem-fraction-static 0.85 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-0 (10.0.2.20)
# decode-0-node0 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 0 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.20 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.20 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.20 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 0 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-1 (10.0.2.21)
# decode-0-node1 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 1 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.21 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.21 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.21 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 1 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-2 (10.0.2.22)
# decode-0-node2 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 2 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.22 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.22 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.22 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 2 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-3 (10.0.2.23)
# decode-0-node3 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 3 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.23 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.23 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.23 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 3 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-4 (10.0.2.24)
# decode-0-node4 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 4 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.24 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.24 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.24 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 4 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-5 (10.0.2.25)
# decode-0-node5 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 5 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.25 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.25 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.25 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 5 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-6 (10.0.2.26)
# decode-0-node6 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 6 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.26 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.26 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.26 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 6 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-7 (10.0.2.27)
# decode-0-node7 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 7 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.27 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.27 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.27 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 7 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600

## host decode-8 (10.0.2.28)
# decode-0-node8 (decode): GPUs 0,1,2,3,4,5,6,7, HTTP :30100, nccl :30600, node 8 of 9, dist-init 10.0.2.20:5500, under its rank group's agent (kit.ranks, leader 10.0.2.20:5540)
GLOO_SOCKET_IFNAME=bond0 MC_GID_INDEX=3 NCCL_IB_GID_INDEX=3 NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 NCCL_SOCKET_IFNAME=bond0 NVSHMEM_HCA_LIST=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1 NVSHMEM_IB_GID_INDEX=3 SGLANG_DG_CACHE_DIR=/var/cache/pdkit/deep_gemm SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5 SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=60 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 SGLANG_HOST_IP=10.0.2.28 SGLANG_ZMQ_ALLOWED_PEERS=10.0.2.20,10.0.2.21,10.0.2.22,10.0.2.23,10.0.2.24,10.0.2.25,10.0.2.26,10.0.2.27,10.0.2.28 SGLANG_ZMQ_SOURCE_IP=10.0.2.28 TORCH_DISTRIBUTED_DEFAULT_TIMEOUT=3600 python -m sglang.launch_server \
  --model-path deepseek-ai/DeepSeek-R1 \
  --trust-remote-code \
  --host 10.0.2.28 \
  --port 30100 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3","4":"mlx5_4","5":"mlx5_5","6":"mlx5_6","7":"mlx5_7"}' \
  --tp-size 72 \
  --attn-dp-size 72 \
  --ep-size 72 \
  --dist-init-addr 10.0.2.20:5500 \
  --nnodes 9 \
  --node-rank 8 \
  --nccl-port 30600 \
  --deepep-mode low_latency \
  --disable-radix-cache \
  --dist-timeout 3600 \
  --enable-dp-lm-head \
  --enable-metrics \
  --enable-two-batch-overlap \
  --ep-num-redundant-experts 32 \
  --max-running-requests 18432 \
  --mem-fraction-static 0.835 \
  --moe-a2a-backend deepep \
  --moe-dense-tp-size 1 \
  --num-reserved-decode-tokens 102 \
  --page-size 1 \
  --watchdog-timeout 3600
