"""ZooKeeper path layouts: where each ledger's metadata node lives, and the fixed nodes.

- flat: ``<root>/L%010d``;
- hierarchical: ids below 2^31 - 1 split ``%010d`` 2-4-4 (``<root>/00/0000/L0001``),
  larger ids split ``%019d`` 3-4-4-4-4 (``<root>/000/0000/0000/0000/L0001``), as
  BookKeeper's HierarchicalLedgerManager (legacy + long) does.

The two-digit and three-digit top-level directories never collide with the fixed nodes
(LAYOUT, INSTANCEID, available, idgen, idgen-long, cookies, underreplication).

The Kafka gateway keeps its state under ``<root>/kafka`` (:func:`kafka_root`): a node per
topic, consumer group, live gateway and transactional id, the partitions that may hold
transactions, and the producer id counter. Its typed stores (``metadata.kafka_topics``,
``metadata.kafka_groups``, ``metadata.kafka_gateways``, ``metadata.kafka_txns``) take
their paths from the functions here.
"""

from __future__ import annotations

import re

__all__ = [
    "LEGACY_LIMIT",
    "LedgerLayout",
    "kafka_acls_path",
    "kafka_broker_configs_path",
    "kafka_gateway_path",
    "kafka_group_path",
    "kafka_offset_index_complete_path",
    "kafka_offset_index_path",
    "kafka_producer_ids_path",
    "kafka_root",
    "kafka_scram_path",
    "kafka_topic_path",
    "kafka_txn_flag_path",
    "kafka_txn_path",
    "ledger_id_from_path",
    "ledger_path",
    "underreplicated_path",
]

LEGACY_LIMIT = (1 << 31) - 1
MAX_LEDGER_ID = (1 << 63) - 1
RESERVED = frozenset({"LAYOUT", "INSTANCEID", "available", "idgen", "idgen-long", "cookies",
                      "underreplication", "gcfreeze", "logs", "kafka"})
_FLAT_NAME = re.compile(r"^L(\d{10})$")


class LedgerLayout:
    FLAT = "flat"
    HIERARCHICAL = "hierarchical"
    ALL = (FLAT, HIERARCHICAL)


def _check_id(ledger_id: int) -> None:
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} outside 0..2^63-1")


def ledger_path(root: str, layout: str, ledger_id: int) -> str:
    _check_id(ledger_id)
    if layout == LedgerLayout.FLAT:
        if ledger_id > 9_999_999_999:
            raise ValueError(f"ledger id {ledger_id} does not fit the flat layout (10 digits)")
        return f"{root}/L{ledger_id:010d}"
    if layout != LedgerLayout.HIERARCHICAL:
        raise ValueError(f"unknown ledger layout {layout!r}")
    if ledger_id < LEGACY_LIMIT:
        s = f"{ledger_id:010d}"
        return f"{root}/{s[0:2]}/{s[2:6]}/L{s[6:10]}"
    s = f"{ledger_id:019d}"
    return f"{root}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def ledger_id_from_path(root: str, layout: str, path: str) -> int:
    """Inverse of :func:`ledger_path`; raises ValueError for anything else."""
    if not path.startswith(root + "/"):
        raise ValueError(f"{path} is not under {root}")
    parts = path[len(root) + 1:].split("/")
    if layout == LedgerLayout.FLAT:
        m = _FLAT_NAME.match(parts[0]) if len(parts) == 1 else None
        if m is None:
            raise ValueError(f"{path} is not a flat ledger path")
        return int(m.group(1))
    widths = [len(p) for p in parts]
    if widths == [2, 4, 5] or widths == [3, 4, 4, 4, 5]:
        if not parts[-1].startswith("L"):
            raise ValueError(f"{path} is not a hierarchical ledger path")
        digits = "".join(parts[:-1]) + parts[-1][1:]
        if digits.isdigit():
            return int(digits)
    raise ValueError(f"{path} is not a hierarchical ledger path")


def underreplicated_path(root: str, ledger_id: int) -> str:
    """``<root>/underreplication/ledgers/<4 x %04x>/urL%010d`` as BookKeeper lays it out."""
    _check_id(ledger_id)
    h = f"{ledger_id:016x}"
    return (f"{root}/underreplication/ledgers/{h[0:4]}/{h[4:8]}/{h[8:12]}/{h[12:16]}/"
            f"urL{ledger_id:010d}")


# -- the Kafka gateway's nodes ------------------------------------------------------------

KAFKA_TOPICS = "topics"
KAFKA_GROUPS = "groups"
KAFKA_GATEWAYS = "gateways"
KAFKA_TRANSACTIONS = "transactions"
KAFKA_TXN_PARTITIONS = "txn_partitions"
KAFKA_PRODUCER_IDS = "producer_ids"
KAFKA_ACLS = "acls"
KAFKA_BROKER_CONFIGS = "broker_configs"
KAFKA_SCRAM = "scram"
KAFKA_OFFSET_INDEX = "offset_index"
KAFKA_OFFSET_INDEX_COMPLETE = "offset_index_complete"
KAFKA_SHARE_GROUPS = "share_groups"
KAFKA_PENDING_OFFSETS = "pending_offsets"


def kafka_root(root: str) -> str:
    """``<root>/kafka``: every node of the Kafka gateway is below it."""
    return f"{root.rstrip('/')}/kafka"


def kafka_topic_path(kafka: str, topic: str) -> str:
    return f"{kafka}/{KAFKA_TOPICS}/{topic}"


def kafka_group_path(kafka: str, znode: str) -> str:
    """A consumer group's record, under its znode name (``kafka_groups.group_znode``)."""
    return f"{kafka}/{KAFKA_GROUPS}/{znode}"


def kafka_share_group_path(kafka: str, znode: str, topic: str | None = None,
                           partition: int = 0) -> str:
    """A share group's record (its configs), under its znode name
    (``kafka_groups.group_znode``), or the state of one of its share partitions."""
    path = f"{kafka}/{KAFKA_SHARE_GROUPS}/{znode}"
    return path if topic is None else f"{path}/{topic}.{partition}"


def kafka_offset_index_path(kafka: str, group: str | None = None,
                            topic: str | None = None) -> str:
    """The groups' offset index (``kafka_offsets``): its root, a group's node (under
    its znode name) or the group's node of one topic."""
    path = f"{kafka}/{KAFKA_OFFSET_INDEX}"
    if group is not None:
        path += f"/{group}"
        if topic is not None:
            path += f"/{topic}"
    return path


def kafka_offset_index_complete_path(kafka: str) -> str:
    """Made once every offset committed before the index existed is indexed."""
    return f"{kafka}/{KAFKA_OFFSET_INDEX_COMPLETE}"


def kafka_gateway_path(kafka: str, node_id: int) -> str:
    return f"{kafka}/{KAFKA_GATEWAYS}/{node_id}"


def kafka_txn_path(kafka: str, znode: str) -> str:
    """A transactional id's record, under its znode name (``kafka_txns.znode_name``)."""
    return f"{kafka}/{KAFKA_TRANSACTIONS}/{znode}"


def kafka_pending_offsets_path(kafka: str, group: str, txn: str | None = None) -> str:
    """A group's index of the transactions holding offsets it has not yet committed
    (``kafka_txns``): the group's node (under its znode name) or one transaction's
    entry (under the transactional id's znode name)."""
    path = f"{kafka}/{KAFKA_PENDING_OFFSETS}/{group}"
    return path if txn is None else f"{path}/{txn}"


def kafka_txn_flag_path(kafka: str, topic: str, partition: int | None = None) -> str:
    """Where a partition records the offset its transactions start from (the topic's
    node with ``partition`` None)."""
    base = f"{kafka}/{KAFKA_TXN_PARTITIONS}/{topic}"
    return base if partition is None else f"{base}/{partition}"


def kafka_producer_ids_path(kafka: str) -> str:
    return f"{kafka}/{KAFKA_PRODUCER_IDS}"


def kafka_acls_path(kafka: str) -> str:
    """The one record of every ACL binding (``kafka_acls``)."""
    return f"{kafka}/{KAFKA_ACLS}"


def kafka_broker_configs_path(kafka: str) -> str:
    """The one record of the dynamic broker configs (``kafka_broker_configs``)."""
    return f"{kafka}/{KAFKA_BROKER_CONFIGS}"


def kafka_scram_path(kafka: str) -> str:
    """The one record of every SCRAM credential (``kafka_scram``)."""
    return f"{kafka}/{KAFKA_SCRAM}"
