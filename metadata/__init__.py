"""Cluster metadata: the MetadataStore protocol with ZooKeeper and in-memory stores, the
ledger metadata model, the ledger manager, bookie registry, cookies, underreplication and
auditor election, log records, and the Kafka gateway's records (``kafka_topics``,
``kafka_groups``, ``kafka_gateways``, ``kafka_txns``, ``kafka_acls``; their JSON declared once in
``jsondoc``).

kazoo is imported only by :mod:`metadata.zookeeper`. The names below are imported on
first use (PEP 562), so that the pure model (``metadata.ledger``, ``metadata.errors``)
imports without trio or kazoo.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerd.metadata.cas import cas_update
    from ledgerd.metadata.errors import (
        BadVersionError,
        ChangeRejectedError,
        CorruptMetadataError,
        MetadataError,
        MetadataUnavailableError,
        NodeExistsError,
        NoNodeError,
    )
    from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
    from ledgerd.metadata.ledgers import LedgerManager
    from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
    from ledgerd.metadata.paths import LedgerLayout
    from ledgerd.metadata.store import MetadataStore, SessionEvent, WatchEvent, WatchKind

_EXPORTS = {
    "BadVersionError": "ledgerd.metadata.errors", "ChangeRejectedError": "ledgerd.metadata.errors",
    "CorruptMetadataError": "ledgerd.metadata.errors", "MetadataError": "ledgerd.metadata.errors",
    "MetadataUnavailableError": "ledgerd.metadata.errors", "NodeExistsError": "ledgerd.metadata.errors",
    "NoNodeError": "ledgerd.metadata.errors", "InMemoryCluster": "ledgerd.metadata.memory",
    "InMemoryStore": "ledgerd.metadata.memory", "LedgerLayout": "ledgerd.metadata.paths",
    "LedgerManager": "ledgerd.metadata.ledgers", "LedgerMetadata": "ledgerd.metadata.ledger",
    "LedgerState": "ledgerd.metadata.ledger", "MetadataStore": "ledgerd.metadata.store",
    "SessionEvent": "ledgerd.metadata.store", "WatchEvent": "ledgerd.metadata.store",
    "WatchKind": "ledgerd.metadata.store", "cas_update": "ledgerd.metadata.cas",
}
__all__ = [
    "BadVersionError", "ChangeRejectedError", "CorruptMetadataError", "InMemoryCluster",
    "InMemoryStore", "LedgerLayout", "LedgerManager", "LedgerMetadata", "LedgerState",
    "MetadataError", "MetadataStore", "MetadataUnavailableError", "NoNodeError",
    "NodeExistsError", "SessionEvent", "WatchEvent", "WatchKind", "cas_update",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'metadata' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
