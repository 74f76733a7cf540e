"""Cluster metadata: the MetadataStore protocol with ZooKeeper and in-memory stores, the
ledger metadata model, the ledger manager, bookie registry, cookies, underreplication and
auditor election, and log records.

kazoo is imported only by :mod:`metadata.zookeeper`. The names below are imported on
first use (PEP 562), so that the pure model (``metadata.ledger``, ``metadata.errors``)
imports without trio or kazoo.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metadata.cas import cas_update
    from metadata.errors import (
        BadVersionError,
        ChangeRejectedError,
        CorruptMetadataError,
        MetadataError,
        MetadataUnavailableError,
        NodeExistsError,
        NoNodeError,
    )
    from metadata.ledger import LedgerMetadata, LedgerState
    from metadata.ledgers import LedgerManager
    from metadata.memory import InMemoryCluster, InMemoryStore
    from metadata.paths import LedgerLayout
    from metadata.store import MetadataStore, SessionEvent, WatchEvent, WatchKind

_EXPORTS = {
    "BadVersionError": "metadata.errors", "ChangeRejectedError": "metadata.errors",
    "CorruptMetadataError": "metadata.errors", "MetadataError": "metadata.errors",
    "MetadataUnavailableError": "metadata.errors", "NodeExistsError": "metadata.errors",
    "NoNodeError": "metadata.errors", "InMemoryCluster": "metadata.memory",
    "InMemoryStore": "metadata.memory", "LedgerLayout": "metadata.paths",
    "LedgerManager": "metadata.ledgers", "LedgerMetadata": "metadata.ledger",
    "LedgerState": "metadata.ledger", "MetadataStore": "metadata.store",
    "SessionEvent": "metadata.store", "WatchEvent": "metadata.store",
    "WatchKind": "metadata.store", "cas_update": "metadata.cas",
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
