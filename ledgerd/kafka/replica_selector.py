"""Fetch from follower (KIP-392): which gateway a consumer should read a partition from.

Kafka's ``RackAwareReplicaSelector`` sends a consumer that says its ``client.rack`` to a
replica in that rack when the leader is elsewhere, so reads stay in the consumer's
availability zone. Every live gateway can serve a partition's reads (from the
partition's ledgers on the bookies; a follower up to what it has learnt is
acknowledged, ``partitions.py``), so here the replicas are the live gateways and the
choice is among those in the consumer's rack: by rendezvous hashing on the
partition, so that a rack's consumers of one partition all read through one gateway
(its read caches serve them all) and different partitions spread over the rack's
gateways. Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

__all__ = ["NO_PREFERENCE", "preferred_read_replica"]

NO_PREFERENCE = -1  # Fetch's preferred_read_replica when the leader serves


def preferred_read_replica(*, client_rack: str, leader: int, racks: Mapping[int, str],
                           partition_key: str) -> int:
    """The gateway the leader tells a consumer in ``client_rack`` to fetch
    ``partition_key`` from, or NO_PREFERENCE: no rack given, the leader is in it, or no
    live gateway is (``racks``: the live gateways' racks, those that have one)."""
    if not client_rack or racks.get(leader) == client_rack:
        return NO_PREFERENCE
    in_rack = [node for node, rack in racks.items() if rack == client_rack]
    if not in_rack:
        return NO_PREFERENCE
    return max(in_rack, key=lambda n: zlib.crc32(f"{n}/{partition_key}".encode()))
