"""The signature table against the lines SGLang 0.5.23, Mooncake and UCX/NIXL really write: one
test per entry, each line as the project prints it (glog prefix for Mooncake, SGLang's logger
prefix, UCX's own), so that a pattern that drifts from its source fails here."""

from __future__ import annotations

import pytest

from kit.observe.signatures import SIGNATURES, diagnose, notable

REAL_LINES = {
    # Mooncake rdma_context.cpp (LOG(WARNING)), as a RoCE host with a wrong index prints it.
    "gid_null": "W0801 09:12:33.123456  4021 rdma_context.cpp:1132] GID is NULL, please check "
    "your GID index by specifying MC_GID_INDEX",
    # Mooncake rdma_context.cpp: PLOG(ERROR) << "Failed to query GID " << index << " on " ...
    "gid_query": "E0801 09:12:33.120001  4021 rdma_context.cpp:1125] Failed to query GID 5 on "
    "mlx5_0/1: Invalid argument [22]",
    # Mooncake worker_pool.cpp; the status is ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR).
    "rail_unreachable": "E0624 11:00:23.673532 74622 worker_pool.cpp:307] Worker: Process failed "
    "for slice (opcode: 1, source_addr: 0x562d8af8eb00, length: 1024, dest_addr: "
    "0x55e665a32540, local_nic: mlx5_1, peer_nic: 10.107.204.141:16388@mlx5_0, dest_rkey: 0, "
    "retry_cnt: 1): transport retry counter exceeded",
    # The same worker_pool.cpp line with ibv_wc_status_str(IBV_WC_LOC_PROT_ERR).
    "local_protection": "E0624 11:00:23.673532 74622 worker_pool.cpp:307] Worker: Process failed "
    "for slice (opcode: 0, source_addr: 0x7f1e00000000, length: 65536, dest_addr: "
    "0x7f3a20000000, local_nic: mlx5_2, peer_nic: 10.107.204.141:16388@mlx5_0, dest_rkey: "
    "2097152, retry_cnt: 0): local protection error",
    # Mooncake rdma_context.cpp: PLOG(ERROR) << "Failed to register memory " << addr (ENOMEM).
    "register_memlock": "E0512 10:02:11.482913 88213 rdma_context.cpp:539] Failed to register "
    "memory 0x7f2b40000000: Cannot allocate memory [12]",
    # The same line when ibv_reg_mr gets GPU memory without nvidia_peermem (EFAULT).
    "register_gpudirect": "E0512 10:02:11.482913 88213 rdma_context.cpp:539] Failed to register "
    "memory 0x7f1e00000000: Bad address [14]",
    # Mooncake rdma_transport.cpp (LOG(WARNING)) after a failed batch registration.
    "register_memory": "W0219 16:31:01.428280 650827 rdma_transport.cpp:400] RdmaTransport: "
    "Failed to register memory: addr 0x7f3620000000 length 375865344",
    # UCX ucp_context.c, with UCX_NET_DEVICES naming a device the host lacks.
    "ucx_device": "[1669031880.738755] [epyc005:588291:0]     ucp_context.c:969  UCX  WARN  "
    "network device 'mlx5_9:1' is not available, please use one or more of: 'bond0'(tcp), "
    "'lo'(tcp), 'mlx5_0:1'(ib)",
    # NIXL's UCX backend (ucx_utils.cpp) when no transport reaches the peer.
    "ucx_endpoint": "ucx_utils.cpp:537   UCX endpoint create failed: failed to create ep",
    # Mooncake transfer_metadata_plugin.cpp, captured from the installed transfer engine
    # (mooncake-transfer-engine-non-cuda 0.3.13.post1) writing to a port nobody listens on.
    "rpc_refused": "E1130 20:30:02.856144 17462 transfer_metadata_plugin.cpp:1030] "
    "SocketHandShakePlugin: connect()10.213.7.12:16000: Connection refused [111]",
    # SGLang disaggregation/common/conn.py (requests' own exception text).
    "bootstrap_unreachable": "[2026-05-12 10:02:11 TP0] Error fetching prefill server info from "
    "bootstrap: HTTPConnectionPool(host='10.0.0.1', port=8998): Max retries exceeded with url: "
    "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1 (Caused "
    "by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f2e1c1b5f90>: "
    "Failed to establish a new connection: [Errno 111] Connection refused'))",
    # SGLang disaggregation/common/conn.py, raised while the decode bootstraps.
    "layout_mismatch": "[2026-05-12 10:02:11 TP0] Decode handshake failed for request rank=0 "
    "decode_req.req.rid='9f2c' decode_req.req.bootstrap_room=4121 with exception Page size "
    "mismatch: prefill server has page_size=16, but decode server has page_size=32. Both "
    "servers must use the same --page-size value.",
    # SGLang disaggregation/decode.py, _verify_kv_checksums.
    "checksum_mismatch": "[2026-05-12 10:02:11 TP0] KV checksum mismatch req=9f2c "
    "bootstrap_room=4121 expected=0x5e1a03c1 got=0x5e1a03c0",
    # SGLang disaggregation/common/conn.py, _check_bootstrap_timeout, as the prefill logs it.
    "bootstrap_timeout": "[2026-05-12 10:07:11 TP0] Prefill bootstrap failed for request rank=0 "
    "req.rid='9f2c' req.bootstrap_room=4121 with exception KVTransferError(bootstrap_room=4121): "
    "Request 4121 timed out after 300.0s in KVPoll.Bootstrapping",
    # SGLang disaggregation/common/conn.py, _check_waiting_timeout, as the decode logs it.
    "transfer_timeout": "[2026-05-12 10:07:11 TP0] Decode transfer failed for request rank=0 "
    "decode_req.req.rid='9f2c' decode_req.req.bootstrap_room=4121 with exception "
    "KVTransferError(bootstrap_room=4121): Request 4121 timed out after 300.0s in "
    "KVPoll.WaitingForInput",
    # SGLang disaggregation/common/conn.py, the decode's heartbeat checker.
    "prefill_lost": "[2026-05-12 10:02:21 TP0] Lost connection with prefill instance "
    "(bootstrap_addr: 10.0.0.1:8998), 3 requests affected",
    # SGLang disaggregation/prefill.py + mooncake/conn.py, a failed Mooncake write.
    "transfer_failed": "[2026-05-12 10:02:11 TP0] Prefill transfer failed for request rank=0 "
    "req.rid='9f2c' req.bootstrap_room=4121 with exception KVTransferError(bootstrap_room=4121): "
    "Failed to send kv chunk of 4121 to 10.0.0.2:37233",
    # torch c10d socket.cpp (SocketConnectOp::throwTimeoutError), a node of a multi-node
    # instance that cannot reach rank 0's TCPStore (torch 2.x's glog-style prefix).
    "dist_init_unreachable": "[E728 15:01:59.561275187 socket.cpp:1028] [c10d] The client socket "
    "has timed out after 600000ms while trying to connect to (10.0.0.1, 5000).",
    # torch ProcessGroupNCCL.cpp (the watchdog's LOG(ERROR)), with its rank prefix.
    "nccl_watchdog": "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
    "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds "
    "before timing out.",
}


def test_every_signature_has_its_real_line():
    assert set(REAL_LINES) == {s.name for s in SIGNATURES}


@pytest.mark.parametrize("signature", SIGNATURES, ids=lambda s: s.name)
def test_the_real_line_is_diagnosed_as_its_own_cause(signature):
    (match,) = diagnose([("decode-0", REAL_LINES[signature.name])])
    assert match.signature.name == signature.name
    assert match.where == "decode-0"
    assert signature.cause and signature.fix and signature.source


def test_the_specific_cause_comes_before_the_generic_symptom():
    log = [
        ("prefill-0", "[2026-05-12 10:02:10] INFO Prefill batch. #new-seq: 1"),
        ("prefill-0", REAL_LINES["transfer_failed"]),
        ("prefill-0", REAL_LINES["rpc_refused"]),
    ]
    assert [m.signature.name for m in diagnose(log)] == ["rpc_refused", "transfer_failed"]


def test_one_match_per_signature_keeps_the_latest_line():
    first = REAL_LINES["checksum_mismatch"]
    later = first.replace("req=9f2c", "req=77aa")
    (match,) = diagnose([("decode-0", first), ("decode-0", later)])
    assert "req=77aa" in match.line


def test_unknown_failures_show_the_lines_that_look_like_errors():
    lines = [
        "[2026-05-12 10:02:10] INFO Prefill batch. #new-seq: 1",
        "[2026-05-12 10:02:11] ERROR something nobody catalogued",
        "Traceback (most recent call last):",
        "[2026-05-12 10:02:12] INFO Decode batch.",
    ]
    assert diagnose(("p", line) for line in lines) == []
    assert notable(lines) == [lines[1], lines[2]]


def test_a_short_line_explains_before_a_request_dumped_as_json():
    short = REAL_LINES["transfer_failed"]
    dumped = '{"event":"request.finished","message":"' + short + '"' + ', "x": 1' * 80 + "}"
    (match,) = diagnose([("decode-0", short), ("decode-0", dumped)])
    assert match.line == short
    (only,) = diagnose([("decode-0", dumped)])
    assert only.line == dumped
