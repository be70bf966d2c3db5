"""The wire format of SGLang 0.5.23's KV events (`srt/disaggregation/kv_events.py`).

A worker started with ``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:PORT",
"topic": T}'`` binds one ZMQ PUB socket per DP rank, at PORT + rank, and sends one multipart
message per scheduler step that changed its radix cache:

* frame 1: the topic (UTF-8 bytes of T, often empty);
* frame 2: the sequence number, 8 bytes big-endian, counting from 0 per publisher (a gap means
  lost batches; a number lower than the last means the publisher restarted);
* frame 3: a msgpack `KVEventBatch`: the array ``[ts, events, attn_dp_rank]``, each event a
  map tagged by ``type`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) whose
  optional fields at their default (None) are left out.

`/server_info` describes the publisher under ``kv_events`` (`describe`): the port base, topic,
block size (the page size) and the number of DP ranks. The Structs below are SGLang's, field
for field, so that msgspec encodes them to the same bytes (tests/oracles holds a batch the real
server sent).
"""

from __future__ import annotations

from typing import Any

import msgspec

SEQ_BYTES = 8
END_SEQ = -1  # the replay socket's end marker


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events (a map with ``type`` = the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


GPU = "GPU"  # StorageMedium.GPU: the device tier, the one routing counts

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


class WireError(ValueError):
    """A message that is not a KV event batch of this format."""


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def frames(topic: str, seq: int, batch: KVEventBatch) -> tuple[bytes, bytes, bytes]:
    """The three frames of one published batch."""
    return topic.encode(), seq.to_bytes(SEQ_BYTES, "big"), encode_batch(batch)


def parse(message: list[bytes]) -> tuple[str, int, KVEventBatch]:
    """(topic, sequence number, batch) of one received multipart message."""
    if len(message) != 3 or len(message[1]) != SEQ_BYTES:
        raise WireError(f"expected 3 frames (topic, 8-byte seq, payload), got {len(message)}")
    try:
        batch = _decoder.decode(message[2])
    except msgspec.DecodeError as exc:
        raise WireError(f"undecodable KV event batch: {exc}") from exc
    return message[0].decode("utf-8", "replace"), int.from_bytes(message[1], "big"), batch


def describe(*, port_base: int, topic: str, block_size: int, dp_size: int) -> dict[str, Any]:
    """The ``kv_events`` block of `/server_info` (SGLang's `describe_kv_events_publisher`)."""
    return {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": port_base,
        "topic": topic,
        "block_size": block_size,
        "dp_size": dp_size,
    }
