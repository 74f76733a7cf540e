"""The root of every error ledgerd raises.

Each package keeps its own root under it (``WireError``, ``StorageError``,
``MetadataError``; the client's errors derive from it directly), with leaves named for
what happened. A caller that wants "anything ledgerd refused or failed at" catches
``LedgerdError`` once; ``ledgerd.LedgerdError`` is this class.

``UnavailableError`` cuts across the packages: it says that too few of the servers an
operation needs could be reached or answered in time (bookies for an ensemble or a
quorum, ZooKeeper for metadata), not that the request or the data is wrong, so the same
request may succeed later. Its leaves say what was missing and whether a write may have
landed: ``NotEnoughBookiesError`` (refused before anything was sent),
``metadata.errors.MetadataUnavailableError``, ``ledgerd.errors.LedgerUnavailableError``
and ``ReplicaTimeoutError``. Callers that answer another protocol (the Kafka gateway's
``storage_errors``) map these types, never their names.
"""

from __future__ import annotations

__all__ = ["LedgerdError", "UnavailableError"]


class LedgerdError(Exception):
    """Root of every ledgerd error: client, wire, storage and metadata."""


class UnavailableError(LedgerdError):
    """Too few of the servers an operation needs could be reached or answered in time;
    the same request may succeed later. Unless the leaf says otherwise, a write that
    failed so may or may not have landed."""
