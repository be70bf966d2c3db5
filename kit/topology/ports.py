"""Default ports, in one place. Per host, instance k of a role gets base + k."""

PREFILL_HTTP = 30000
DECODE_HTTP = 30100
BOOTSTRAP = 8998
PREFILL_DIST_INIT = 5000
DECODE_DIST_INIT = 5500
# SGLang derives its inter-node ZMQ ports from the dist-init port: port+1 .. port+4+dp_size.
# Instances on one rank-0 host are spaced this far apart so their blocks never overlap.
DIST_INIT_STRIDE = 50
# CPU hosts: --nccl-port per server (SGLang's own choice races between servers starting
# together). Clear of the HTTP bases' ZMQ blocks (--port + 233..238, server_args.py:818-845).
PREFILL_NCCL = 30500
DECODE_NCCL = 30600
ROUTER = 8000
ROUTER_METRICS = 29000
PROMETHEUS = 9090
# Mooncake transfer engine RPC range (MC_MIN_RPC_PORT .. MC_MAX_RPC_PORT defaults).
MOONCAKE_RPC = range(15000, 17001)


def dist_init_block(port: int, dp_size: int) -> range:
    """Ports SGLang uses for a multi-node instance whose --dist-init-addr port is `port`."""
    return range(port, port + 5 + dp_size)
