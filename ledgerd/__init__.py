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

from ledgerd.client import Client, open_client
from ledgerd.config import ClientConfig, ConfigError
from ledgerd.errors import (
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
)
from ledgerd.handles import PendingAppend, ReadHandle, WriteHandle
from ledgerd.ledgerlog import LogFencedError, LogPosition, LogWriter, NoSuchLogError
from ledgerd.sync import SyncClient, SyncLogWriter, SyncReadHandle, SyncWriteHandle
from wire.entry import Entry

__all__ = [
    "BadPasswordError", "Client", "ClientClosedError", "ClientConfig", "ConfigError", "Entry",
    "EntryUnavailableError", "LedgerClosedError", "LedgerFencedError", "LedgerHandleError",
    "LedgerRecoveryError", "LedgerdError", "LogFencedError", "LogPosition", "LogWriter",
    "NoSuchLedgerError", "NoSuchLogError", "NotEnoughBookiesError", "PendingAppend",
    "ReadBeyondLacError", "ReadHandle", "SyncClient", "SyncLogWriter", "SyncReadHandle",
    "SyncWriteHandle", "WriteHandle", "__version__", "open_client",
]

__version__ = "0.1.0"
