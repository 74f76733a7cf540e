"""Cluster metadata: the MetadataStore protocol with ZooKeeper and in-memory stores, the
ledger metadata model, the ledger manager, bookie registry, cookies, underreplication and
auditor election, and log records.

kazoo is imported only by :mod:`metadata.zookeeper`; importing this package does not
import it.
"""

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

__all__ = [
    "BadVersionError", "ChangeRejectedError", "CorruptMetadataError", "InMemoryCluster",
    "InMemoryStore", "LedgerLayout", "LedgerManager", "LedgerMetadata", "LedgerState",
    "MetadataError", "MetadataStore", "MetadataUnavailableError", "NoNodeError",
    "NodeExistsError", "SessionEvent", "WatchEvent", "WatchKind", "cas_update",
]
