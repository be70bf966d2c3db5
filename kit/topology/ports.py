"""Default ports, in one place. Per host, instance k of a role gets base + k."""

PREFILL_HTTP = 30000
DECODE_HTTP = 30100
BOOTSTRAP = 8998
PREFILL_DIST_INIT = 5000
DECODE_DIST_INIT = 5500
# Instances on one rank-0 host get dist-init ports this far apart, so that the ports SGLang
# derives from each (`dist_init_ports`) never overlap.
DIST_INIT_STRIDE = 50
# --nccl-port per server: SGLang's own choice (a random free port in 22000-29999) races between
# servers starting together and may take the router's metrics port. Clear of the HTTP bases'
# ZMQ blocks (--port + 233..238, server_args.py:818-845).
PREFILL_NCCL = 30500
DECODE_NCCL = 30600
# SGLang's --kv-events-config publishers (its documented example uses 5557); one per DP rank.
PREFILL_KV_EVENTS = 5557
DECODE_KV_EVENTS = 5657
ROUTER = 8000
ROUTER_METRICS = 29000
PROMETHEUS = 9090
# Mooncake Store master (mooncake_master defaults): RPC, metrics/health, embedded metadata.
KV_POOL_RPC = 50051
KV_POOL_METRICS = 9003
KV_POOL_METADATA = 8080
# Mooncake transfer engine RPC range (MC_MIN_RPC_PORT .. MC_MAX_RPC_PORT defaults).
MOONCAKE_RPC = range(15000, 17001)


# SGLang 0.5.23 (`srt/server_args.py` PortArgs.init_new): with DP attention its ZMQ sockets
# are TCP on the dist-init host, at the dist-init port (torch's store) and the six after it;
# without --dist-init-addr that block starts at --port + ZMQ_TCP_PORT_DELTA. The DP controller's
# handshake (`managers/data_parallel_controller.py`) binds dist-init port (else --port) + 13.
ZMQ_TCP_PORT_DELTA = 233
ZMQ_DERIVED_PORTS = 7
DP_HANDSHAKE_PORT_DELTA = 13
# pdkit's rank group (kit/ranks): the agent beside node rank 0 of a multi-node instance listens
# here for the other ranks' agents; inside the instance's dist-init stride, past SGLang's block.
RANK_GROUP_PORT_DELTA = 40


def dist_init_ports(http_port: int, dist_init_port: int | None, attention_dp: bool) -> range:
    """The block SGLang binds from the dist-init port on an instance's rank-0 host: the port
    itself (torch's rendezvous) and, with DP attention, its ZMQ ports. Without a dist-init port
    a DP-attention instance derives the block from its HTTP port (`--port` + 233 ..)."""
    if dist_init_port is None:
        if not attention_dp:
            return range(0)
        dist_init_port = http_port + ZMQ_TCP_PORT_DELTA
    return range(dist_init_port, dist_init_port + (ZMQ_DERIVED_PORTS if attention_dp else 1))


def dp_handshake_port(http_port: int, dist_init_port: int | None) -> int:
    """The DP controller's handshake port (DP attention): dist-init port + 13, else --port + 13."""
    return (dist_init_port if dist_init_port is not None else http_port) + DP_HANDSHAKE_PORT_DELTA


def rank_group_port(dist_init_port: int) -> int:
    """The port the rank group's leader (beside node rank 0) listens on: dist-init port + 40."""
    return dist_init_port + RANK_GROUP_PORT_DELTA
