"""A ZMQ publisher of KV event batches, framed as SGLang 0.5.23's `ZmqEventPublisher` frames
them (see `wire`): one PUB socket per DP rank at the endpoint's port + rank, the sequence number
counting from 0. The emulated worker publishes through it; SGLang's replay socket is not
emulated (a consumer that sees a gap drops what it knew of that rank instead)."""

from __future__ import annotations

import logging
import time

import zmq

from kit.kvevents import wire

logger = logging.getLogger(__name__)


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """SGLang's `offset_endpoint_port`: the port of a tcp:// endpoint plus the DP rank."""
    if dp_rank == 0 or not endpoint.startswith("tcp://"):
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + dp_rank}"


class Publisher:
    """One DP rank's PUB socket. `publish` never blocks: past the high-water mark ZMQ drops,
    and the subscriber sees the gap."""

    def __init__(self, endpoint: str, topic: str, dp_rank: int, hwm: int = 100_000) -> None:
        self.endpoint = offset_endpoint(endpoint, dp_rank)
        self.topic = topic
        self.dp_rank = dp_rank
        self.seq = 0
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(hwm)
        host = self.endpoint[len("tcp://") :].rpartition(":")[0]
        # SGLang binds wildcard hosts and connects to concrete ones.
        if host in ("*", "0.0.0.0", "[::]", "::") or not self.endpoint.startswith("tcp://"):
            self._socket.bind(self.endpoint)
        else:
            self._socket.connect(self.endpoint)

    def publish(self, events: list[wire.Event]) -> None:
        if not events:
            return
        batch = wire.KVEventBatch(ts=time.time(), events=events, attn_dp_rank=self.dp_rank)
        try:
            self._socket.send_multipart(
                wire.frames(self.topic, self.seq, batch), flags=zmq.NOBLOCK, copy=False
            )
        except zmq.Again:
            logger.warning("KV events: rank %d dropped batch %d", self.dp_rank, self.seq)
        self.seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)
