"""ledgerd: the Python client of the ledgerd replicated journal.

This is the one name applications import::

    import ledgerd

    async with ledgerd.open_client("127.0.0.1:2181") as client:
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        await lh.append(b"hello")
        await lh.close()

``ledgerd.SyncClient`` is the same API for scripts and Spark executors, without async.
``ledgerd.spark`` (PySpark data sources) is imported lazily, so the client works
without pyspark installed.
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

# A library never configures output: every ledgerd.* logger propagates here, and this
# handler keeps Python's last-resort handler from printing WARNING and above on the
# application's stderr (ledger_handle_failed, bookie_unavailable, ...). An application
# that configures logging (logging.basicConfig, a handler on the root or on "ledgerd")
# sees every record as before; the ledgerd command configures its own.
logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from ledgerd.client import Client, open_client
    from ledgerd.config import ClientConfig, ConfigError
    from ledgerd.errors import (
        AccessDeniedError,
        BadPasswordError,
        ClientClosedError,
        EntryUnavailableError,
        LedgerClosedError,
        LedgerdError,
        LedgerFencedError,
        LedgerHandleError,
        LedgerRecoveryError,
        NoSuchLedgerError,
        NotEnoughBookiesError,
        ReadBeyondLacError,
        ReplicaTimeoutError,
    )
    from ledgerd.handles import PendingAppend, ReadHandle, WriteHandle
    from ledgerd.ledgerlog import (
        BatchAlreadyAppendedError,
        LogFencedError,
        LogPosition,
        LogWriter,
        NoSuchLogError,
    )
    from ledgerd.sync import SyncClient, SyncLogWriter, SyncReadHandle, SyncWriteHandle
    from ledgerd.wire.entry import Entry
    from ledgerd.wire.errors import MessageTooLargeError

# Imported on first use (PEP 562), so that ``import ledgerd.base.logs`` from the bookie's own
# modules does not pull in the whole client (and its imports of those same modules).
_EXPORTS = {
    "AccessDeniedError": "ledgerd.errors",
    "BadPasswordError": "ledgerd.errors",
    "BatchAlreadyAppendedError": "ledgerd.ledgerlog",
    "Client": "ledgerd.client",
    "ClientClosedError": "ledgerd.errors",
    "ClientConfig": "ledgerd.config",
    "ConfigError": "ledgerd.config",
    "Entry": "ledgerd.wire.entry",
    "EntryUnavailableError": "ledgerd.errors",
    "LedgerClosedError": "ledgerd.errors",
    "LedgerFencedError": "ledgerd.errors",
    "LedgerHandleError": "ledgerd.errors",
    "LedgerRecoveryError": "ledgerd.errors",
    "LedgerdError": "ledgerd.errors",
    "LogFencedError": "ledgerd.ledgerlog",
    "LogPosition": "ledgerd.ledgerlog",
    "LogWriter": "ledgerd.ledgerlog",
    "MessageTooLargeError": "ledgerd.wire.errors",
    "NoSuchLedgerError": "ledgerd.errors",
    "NoSuchLogError": "ledgerd.ledgerlog",
    "NotEnoughBookiesError": "ledgerd.errors",
    "PendingAppend": "ledgerd.handles",
    "ReadBeyondLacError": "ledgerd.errors",
    "ReplicaTimeoutError": "ledgerd.errors",
    "ReadHandle": "ledgerd.handles",
    "SyncClient": "ledgerd.sync",
    "SyncLogWriter": "ledgerd.sync",
    "SyncReadHandle": "ledgerd.sync",
    "SyncWriteHandle": "ledgerd.sync",
    "WriteHandle": "ledgerd.handles",
    "open_client": "ledgerd.client",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError", "BadPasswordError", "BatchAlreadyAppendedError", "Client", "ClientClosedError", "ClientConfig", "ConfigError", "Entry",
    "EntryUnavailableError", "LedgerClosedError", "LedgerFencedError", "LedgerHandleError",
    "LedgerRecoveryError", "LedgerdError", "LogFencedError", "LogPosition", "LogWriter",
    "MessageTooLargeError",
    "NoSuchLedgerError", "NoSuchLogError", "NotEnoughBookiesError", "PendingAppend",
    "ReadBeyondLacError", "ReadHandle", "ReplicaTimeoutError", "SyncClient", "SyncLogWriter", "SyncReadHandle",
    "SyncWriteHandle", "WriteHandle", "__version__", "open_client",
]

__version__ = "0.1.0"


def __dir__() -> list[str]:
    """The public API (``dir(ledgerd)``), not this module's own imports."""
    return sorted(__all__)
