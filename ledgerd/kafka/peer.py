"""One gateway asking another to write a transaction marker (Kafka's WriteTxnMarkers).

A transaction's coordinator writes the markers of the partitions it leads itself; a
partition that another gateway leads gets its marker through that gateway, as a
Kafka broker's coordinator sends WriteTxnMarkers to each partition's leader. This is
the smallest Kafka client that does it: one connection per marker, WriteTxnMarkers v0
(request header v1), the partition's error code back. The gateway that receives it
writes the marker only if it leads the partition (NOT_LEADER_OR_FOLLOWER otherwise,
and the coordinator asks again where rendezvous hashing now points).

Limits: plain TCP only. Gateways whose listeners require TLS or SASL do not accept
these connections, so a transaction spanning partitions that different gateways lead
completes only when the coordinator leads them all (or the listener is plain).
"""

from __future__ import annotations

import struct

import trio

from ledgerd.kafka.api import REQUEST_HEADER, REQUESTS, RESPONSES, ApiKey
from ledgerd.kafka.schema import INT32, KafkaDecodeError, Reader, decode, encode
from ledgerd.kafka.txn_coordinator import Marker

__all__ = ["send_marker"]

_SIZE = struct.Struct(">i")
PEER_TIMEOUT_S = 10.0
MAX_REPLY = 1 << 20


def marker_request(marker: Marker, correlation_id: int = 1) -> bytes:
    """The framed WriteTxnMarkers v0 request for one marker."""
    header = encode(REQUEST_HEADER, 1, {
        "api_key": int(ApiKey.WRITE_TXN_MARKERS), "api_version": 0,
        "correlation_id": correlation_id, "client_id": "ledgerd-txn-coordinator"})
    body = encode(REQUESTS[ApiKey.WRITE_TXN_MARKERS], 0, {"markers": [{
        "producer_id": marker.producer_id, "producer_epoch": marker.producer_epoch,
        "transaction_result": marker.commit, "coordinator_epoch": 0,
        "topics": [{"name": marker.topic, "partition_indexes": [marker.partition]}]}]})
    payload = b"".join([*header, *body])
    return _SIZE.pack(len(payload)) + payload


def marker_reply(frame: bytes, marker: Marker, correlation_id: int = 1) -> int:
    """The partition's error code in a WriteTxnMarkers v0 response (without its size
    prefix). Raises KafkaDecodeError if it is not one."""
    r = Reader(frame)
    if r.scalar(INT32, "correlation id") != correlation_id:
        raise KafkaDecodeError("WriteTxnMarkers reply to another request")
    body = decode(RESPONSES[ApiKey.WRITE_TXN_MARKERS], 0, r, "WriteTxnMarkers")
    for m in body["markers"]:
        for t in m["topics"]:
            for p in t["partitions"]:
                if t["name"] == marker.topic and p["partition_index"] == marker.partition:
                    return int(p["error_code"])
    raise KafkaDecodeError("WriteTxnMarkers reply without the partition asked for")


async def send_marker(host: str, port: int, marker: Marker) -> int:
    """Ask the gateway at ``host:port`` to write ``marker``: its error code (0: written).
    Raises OSError / trio.BrokenResourceError / KafkaDecodeError if it cannot be asked,
    trio.TooSlowError after PEER_TIMEOUT_S. If cancelled, the marker may have been
    written (writing it again is harmless)."""
    with trio.fail_after(PEER_TIMEOUT_S):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(marker_request(marker))
            buf = bytearray()
            while len(buf) < 4 or len(buf) < 4 + _SIZE.unpack_from(buf)[0]:
                if len(buf) >= 4 and not 4 <= _SIZE.unpack_from(buf)[0] <= MAX_REPLY:
                    raise KafkaDecodeError("WriteTxnMarkers reply of a bad size")
                data = await stream.receive_some(65536)
                if not data:
                    raise trio.BrokenResourceError(f"gateway {host}:{port} closed the "
                                                   "connection")
                buf += data
            return marker_reply(bytes(buf[4:4 + _SIZE.unpack_from(buf)[0]]), marker)


