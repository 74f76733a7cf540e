"""DescribeLogDirs: the partitions' sizes, as Kafka UIs (AKHQ, kafka-ui, Redpanda
Console) and kafka-python's ``describe_log_dirs`` read them.

A gateway keeps no log directory: every partition's log is a chain of ledgers on the
bookies. Each gateway answers one "log dir", named after the cluster's ZooKeeper
ledgers root (``zk_ledgers_root_path``, e.g. ``/ledgers``), holding the partitions
Metadata makes it a replica of (every live gateway, unless a replica assignment was
given at creation), as a Kafka broker lists the replicas it hosts: a client that sums
over brokers counts each partition once per replica, as it would on Kafka.

PartitionSize is the bytes of the partition's ledgers: a closed ledger's length from
its metadata (remembered: it never changes), the ledger being written from its
writer's handle on the gateway that writes it (its leader); another gateway counts
that ledger only once it is closed (its metadata has no length before), so the
leader's figure is the current one. OffsetLag is 0 (no follower copies a log),
IsFutureKey false, and TotalBytes / UsableBytes (v4) -1: the bytes are spread over
the bookies' disks, no one volume holds them. The partitions are measured
``TXN_ADMIN_READS`` at a time, each ledger's metadata read once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.errors import LedgerdError, NoSuchLedgerError
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.topics import valid_topic_name
from ledgerd.kafka.txn_admin import TXN_ADMIN_READS
from ledgerd.metadata.errors import NoNodeError

if TYPE_CHECKING:
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.partitions import PartitionLog

__all__ = ["describe_log_dirs", "log_dir_name", "partition_size", "wanted_partitions"]

MAX_REMEMBERED = 1 << 16  # closed ledgers' lengths remembered (ledger ids are unique)
_closed_lengths: OrderedDict[int, int] = OrderedDict()


def log_dir_name(ledgers_root: str) -> str:
    return "/" + ledgers_root.strip("/")


def wanted_partitions(requested: list[dict[str, Any]] | None, counts: dict[str, int],
                      ) -> list[tuple[str, list[int]]]:
    """The (topic, partitions) to describe (pure): every partition of every topic of
    ``counts`` (name -> partition count) when ``requested`` is None, else those asked
    that exist (an unknown topic or partition is left out, as Kafka leaves out what a
    broker does not host)."""
    if requested is None:
        return [(t, list(range(n))) for t, n in sorted(counts.items())]
    out: dict[str, list[int]] = {}
    for t in requested:
        n = counts.get(t["topic"])
        if n is None:
            continue
        parts = out.setdefault(t["topic"], [])
        parts.extend(p for p in t["partitions"] if 0 <= p < n and p not in parts)
    return [(t, ps) for t, ps in out.items()]


async def partition_size(part: PartitionLog) -> int:
    """The bytes of the partition's ledgers (see the module docstring)."""
    total = 0
    for lid in await part.ledgers():
        writer = part.writer
        if writer is not None and writer.ledger_id == lid:
            total += writer.handle.length
            continue
        known = _closed_lengths.get(lid)
        if known is None:
            try:
                md = await part.client.ledger_metadata(lid)
            except NoSuchLedgerError:
                continue  # dropped (retention) since the list was read
            if not md.is_closed:
                continue  # written by another gateway: no length until closed
            known = _closed_lengths[lid] = md.length
            while len(_closed_lengths) > MAX_REMEMBERED:
                _closed_lengths.popitem(last=False)
        total += known
    return total


async def describe_log_dirs(gw: Gateway, conn: Any, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
    requested = body["topics"]
    names = await gw.all_topics() if requested is None else \
        list(dict.fromkeys(t["topic"] for t in requested))
    counts: dict[str, int] = {}
    for name in names:
        count = await gw.partition_count(name) if valid_topic_name(name) else None
        if count is not None:
            counts[name] = count
    limit = trio.Semaphore(TXN_ADMIN_READS)
    topics: list[dict[str, Any]] = []
    error: int = 0

    async def measure(into: list[dict[str, Any]], topic: str, p: int) -> None:
        nonlocal error
        async with limit:
            try:
                size = await partition_size(gw.partition(topic, p))
            except NoNodeError:
                return  # the topic went meanwhile
            except LedgerdError:
                error = ErrorCode.KAFKA_STORAGE_ERROR  # the dir's, as a broker's bad disk
                return
        into.append({"partition_index": p, "partition_size": size, "offset_lag": 0,
                     "is_future_key": False})

    async with trio.open_nursery() as nursery:
        for topic, parts in wanted_partitions(requested, counts):
            hosted = [p for p in parts
                      if gw.node_id in gw._replicas(topic, p, gw.owner(f"{topic}/{p}"))[0]]
            if not hosted:
                continue
            out: list[dict[str, Any]] = []
            topics.append({"name": topic, "partitions": out})
            for p in hosted:
                nursery.start_soon(measure, out, topic, p)
    for t in topics:
        t["partitions"].sort(key=lambda x: x["partition_index"])
    return {"error_code": 0, "results": [{
        "error_code": error, "log_dir": log_dir_name(gw.config.zk_ledgers_root_path),
        "topics": [t for t in topics if t["partitions"]] if not error else [],
        "total_bytes": -1, "usable_bytes": -1}]}
