"""Why a KV transfer failed: known log lines of SGLang 0.5.23, Mooncake and NIXL/UCX, each with
its cause and fix. Pure: the caller brings the lines (an HTTP error message, a log tail).

Every pattern is taken from the line its project writes (the source file is named in `source`)
and tested against a copy of that real line (tests/unit/observe/test_observe_signatures.py).
Entries are ordered from the most specific cause to the most generic symptom: `diagnose`
returns the matches in table order, so the first one is the best explanation, and a generic
line ("Failed to send kv chunk") never hides the line that says why it failed.

A line that matches nothing is still worth showing when it looks like an error (`notable`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    """One known failure: `pattern` finds its line; `cause` says what is wrong, `fix` what to
    do; `source` is where the line comes from (project and file)."""

    name: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    source: str


def _sig(name: str, pattern: str, cause: str, fix: str, source: str) -> Signature:
    return Signature(name, re.compile(pattern), cause, fix, source)


SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "gid_null",
        r"GID is NULL, please check your GID index",
        "the RoCE GID index the transfer engine uses has no GID on this NIC",
        "set transfer.gid_index to a RoCE v2 index that every NIC has (`pdkit discover T` "
        "proposes one; `show_gids` lists them), then `pdkit up` again",
        "Mooncake rdma_context.cpp",
    ),
    _sig(
        "gid_query",
        r"Failed to query GID \d+ on \S+",
        "the RoCE GID index does not exist on this NIC (MC_GID_INDEX out of the GID table)",
        "set transfer.gid_index to an index listed by `show_gids` on every worker host "
        "(`pdkit discover T` proposes a common one)",
        "Mooncake rdma_context.cpp",
    ),
    _sig(
        "rail_unreachable",
        r"Process failed for slice .*: transport retry counter exceeded",
        "RDMA packets from this NIC never reach the peer's NIC: a rail that cannot reach the "
        "peer's rail, a non-routable GID (link-local fe80::) or a RoCE network without "
        "lossless/PFC settings",
        "map each GPU to the NIC on its own rail (hosts[].gpu_nics; `pdkit discover T` proposes "
        "the map), use a routable RoCE v2 transfer.gid_index, and check the switch path with "
        "`ib_write_bw` between the two hosts",
        "Mooncake worker_pool.cpp",
    ),
    _sig(
        "local_protection",
        r"Process failed for slice .*: local protection error",
        "the NIC refused to read or write a KV buffer of this process (ibverbs' local "
        "protection error): the buffer is not registered with this NIC, or no longer; seen "
        "with GPU memory behind a missing or wrong GPUDirect path (the cause is unresolved "
        "upstream, Mooncake's 'Failed to get kvcache' follows)",
        "check GPUDirect RDMA and the NICs (`pdkit provision T --check`: nvidia_peermem or "
        "dma-buf, each GPU's NIC on its rail), test the rails (`pdkit provision T "
        "--transfer-test`), and report the line upstream with both roles' Mooncake version",
        "Mooncake worker_pool.cpp",
    ),
    _sig(
        "register_memlock",
        r"Failed to register memory.*(Cannot allocate memory|\[12\])",
        "the NIC could not pin the KV buffer: the locked-memory limit is too low",
        "make the locked-memory limit unlimited for the workers (`pdkit provision T` sets "
        "limits.d and LimitMEMLOCK=infinity; `ulimit -l` in the worker's shell must say "
        "unlimited)",
        "Mooncake rdma_context.cpp",
    ),
    _sig(
        "register_gpudirect",
        r"Failed to register memory.*(Bad address|Invalid argument|\[14\]|\[22\])",
        "the NIC cannot register GPU memory: GPUDirect RDMA is missing (nvidia_peermem not "
        "loaded, and no dma-buf support)",
        "load it (`modprobe nvidia_peermem`, and list it in /etc/modules-load.d), or use the "
        "NVIDIA open kernel modules with dma-buf; `pdkit provision T` checks for it",
        "Mooncake rdma_context.cpp",
    ),
    _sig(
        "register_memory",
        r"Failed to register memory",
        "the NIC could not register the KV buffer (locked-memory limit, or GPUDirect RDMA "
        "missing for GPU memory)",
        "check `ulimit -l` (unlimited) and GPUDirect RDMA (`lsmod | grep nvidia_peermem`); "
        "`pdkit provision T` checks both",
        "Mooncake rdma_context.cpp",
    ),
    _sig(
        "ucx_device",
        r"UCX\s+WARN\s+network device '[^']*' is not available",
        "NIXL's UCX was told to use a network device this host does not have",
        "name the host's real devices in hosts[].rdma_devices / gpu_nics (pdkit renders "
        "UCX_NET_DEVICES or --disaggregation-ib-device from them); `ucx_info -d` lists them",
        "UCX ucp_context.c",
    ),
    _sig(
        "ucx_endpoint",
        r"UCX endpoint create failed|UCX\s+ERROR\s+no active messages transport",
        "UCX found no transport that reaches the peer (wrong or down device, no RDMA path)",
        "check UCX_NET_DEVICES / the NIC map against `ucx_info -d` on both hosts, and that "
        "the peer's device is up",
        "NIXL ucx_utils.cpp, UCX ucp_ep.c",
    ),
    _sig(
        "rpc_refused",
        r"SocketHandShakePlugin: connect\(\)\S+: Connection refused",
        "the peer's Mooncake handshake (RPC) port refused the connection: a firewall between "
        "the hosts, or the peer process is gone",
        "open TCP 15000-17000 (Mooncake's RPC range) between every prefill and decode host, "
        "and check the peer is running (`pdkit status T`)",
        "Mooncake transfer_metadata_plugin.cpp",
    ),
    _sig(
        "bootstrap_unreachable",
        r"Could not fetch prefill parallel info from bootstrap_addr"
        r"|Error fetching prefill server info from bootstrap",
        "the decode cannot reach the prefill's bootstrap server (its --host and "
        "--disaggregation-bootstrap-port): refused, filtered, or bound to another address",
        "make the prefill bind a routable address (prefill.bind) and open its bootstrap port "
        "to the decode hosts",
        "SGLang disaggregation/common/conn.py",
    ),
    _sig(
        "layout_mismatch",
        r"(Page size|KV cache dtype) mismatch: prefill server has",
        "prefill and decode lay out KV differently (--page-size or --kv-cache-dtype differ)",
        "set page-size and kv-cache-dtype once under defaults.args so both roles share them",
        "SGLang disaggregation/common/conn.py",
    ),
    _sig(
        "checksum_mismatch",
        r"KV checksum mismatch",
        "the KV the decode received differs from what the prefill sent: corrupted on the way "
        "(NIC, PCIe, GPUDirect path) or written into the wrong pages",
        "run `pdkit provision T --transfer-test` to test every rail; check the NIC firmware "
        "and PCIe errors (`dmesg`, `ibv_devinfo`), and both roles' page size and KV dtype",
        "SGLang disaggregation/decode.py",
    ),
    _sig(
        "bootstrap_timeout",
        r"timed out after [\d.]+s in KVPoll\.Bootstrapping",
        "the prefill never heard from the decode of this request: the decode could not reach "
        "it, or had no KV room",
        "check the decode's log for the reason, and that decodes reach the prefill's bootstrap "
        "port and Mooncake ports (15000-17000); when it happens only under load (the decodes "
        "short of KV room), raise transfer.timeouts.bootstrap_timeout_s "
        "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s) or add decode capacity",
        "SGLang disaggregation/common/conn.py",
    ),
    _sig(
        "transfer_timeout",
        r"timed out after [\d.]+s in KVPoll\.WaitingForInput"
        r"|Sync (batch )?data transfer timeout|Slice timeout detected",
        "the KV transfer started and never finished: packets dropped between the NICs (a "
        "firewall dropping the Mooncake ports, a NIC on the wrong rail, a wrong GID index)",
        "open TCP 15000-17000 between prefill and decode hosts, check the NIC map and "
        "transfer.gid_index (`pdkit discover T`), and test the rails with "
        "`pdkit provision T --transfer-test`; when it happens only under load (transfers queued "
        "behind others), raise transfer.timeouts.waiting_timeout_s "
        "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s) and the transfer threads "
        "(SGLANG_DISAGGREGATION_THREAD_POOL_SIZE in the roles' env)",
        "SGLang disaggregation/common/conn.py, Mooncake transfer_engine",
    ),
    _sig(
        "prefill_lost",
        r"Lost connection with prefill instance",
        "the decode stopped hearing from the prefill (heartbeat failures): the prefill died or "
        "hangs",
        "see the prefill's log (`pdkit logs T prefill-N`) and `pdkit status T`",
        "SGLang disaggregation/common/conn.py",
    ),
    _sig(
        "transfer_failed",
        r"Failed to send kv chunk of \d+ to \S+"
        r"|Failed to get kvcache from prefill instance, it might be dead"
        r"|Decode instance could be dead, remote mooncake session",
        "the transfer engine reported the write as failed",
        "the lines around it in both workers' logs say why; `pdkit provision T "
        "--transfer-test` tests the path between the two hosts",
        "SGLang disaggregation/mooncake/conn.py",
    ),
    _sig(
        "dist_init_unreachable",
        r"The client socket has timed out after \S+ while trying to connect to \(",
        "a node of a multi-node instance could not reach its rank 0's dist-init port "
        "(torch.distributed's TCPStore): a firewall, a wrong address, or rank 0 not started",
        "open the dist-init port (`pdkit render T --json`: workers[].dist_init_addr) between the "
        "instance's nodes and set hosts[].network_interface; `pdkit provision T --check` tries "
        "the port from every node",
        "torch distributed/c10d socket.cpp",
    ),
    _sig(
        "nccl_watchdog",
        r"Watchdog caught collective operation timeout",
        "a collective between the ranks of an instance did not finish within torch's timeout: "
        "a rank hung or died, the link between the nodes is broken or slow, or one step "
        "(loading, DeepGEMM compiling) took longer on one rank",
        "raise cluster.distributed_timeout_s (--dist-timeout and "
        "TORCH_DISTRIBUTED_DEFAULT_TIMEOUT; `cluster.profile: wide_ep` sets 3600 s) when a "
        "step is only slow; when a rank hangs, see every node's log (`pdkit logs T NAME`) and "
        "check NCCL_SOCKET_IFNAME / NCCL_IB_HCA (hosts[].network_interface, rdma_devices)",
        "torch distributed/c10d ProcessGroupNCCL.cpp",
    ),
)

_NOTABLE = re.compile(
    r"\b(ERROR|Error|error|WARN(ING)?|Traceback|[Ff]ailed|[Ee]xception|timed out|refused)\b"
)


@dataclass(frozen=True)
class Match:
    """A signature found in a line; `where` names the line's origin (a process's log)."""

    signature: Signature
    line: str
    where: str


LONG_LINE = 400
"""Longer lines (a request dumped as JSON) explain a match only when no shorter one does."""


def diagnose(lines: Iterable[tuple[str, str]]) -> list[Match]:
    """The signatures found in `(where, line)` pairs, in table order (best explanation first),
    one match per signature: its last line (the most recent), a short one before a long one."""
    found: dict[str, Match] = {}
    for where, line in lines:
        for signature in SIGNATURES:
            if signature.pattern.search(line):
                old = found.get(signature.name)
                text = line.strip()
                if old is None or len(text) <= LONG_LINE or len(old.line) > LONG_LINE:
                    found[signature.name] = Match(signature, text, where)
                break
    order = {s.name: i for i, s in enumerate(SIGNATURES)}
    return sorted(found.values(), key=lambda m: order[m.signature.name])


def notable(lines: Iterable[str], limit: int = 5) -> list[str]:
    """The last `limit` lines that look like errors or warnings (for unknown failures)."""
    return [line.strip() for line in lines if _NOTABLE.search(line)][-limit:]
