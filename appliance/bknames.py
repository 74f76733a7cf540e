"""The bookie's BookKeeper names: how ledgerd reads each ``bk_server.conf`` key.

Every name of BookKeeper's bookie parameter tables (seed 001, "Bookie Configuration
Parameters") is here, mapped to a :class:`~ledgerd.appliance.config.BookieConfig` key
in BookKeeper's unit, or ignored with the reason this design has no use for it; so are
the names BookKeeper's shipped ``conf/bk_server.conf`` sets that ledgerd can honour.
docs/configuration.md prints this table (tests/ledgerd/test_bknames.py keeps it true).
"""

from __future__ import annotations

import socket

from ledgerd.base.bknames import BkName
from ledgerd.metadata.settings import ZOOKEEPER_NAMES

__all__ = ["BOOKIE_NAMES"]

_ONE_LOOP = ("one trio event loop per bookie serves every connection (the journal's "
             "writes and syncs run on their own native threads); there is no thread pool "
             "to size")


def _single_journal(value: object) -> dict[str, object]:
    dirs = [d.strip() for d in (value if isinstance(value, (list, tuple))
                                else str(value).split(",")) if str(d).strip()]
    if len(dirs) != 1:
        raise ValueError("one directory (a ledgerd bookie writes one journal; give the "
                         "others to ledgerDirectories)")
    return {"journal_directory": dirs[0]}


def _interface_address(value: object) -> dict[str, object]:
    """BookKeeper binds a network interface by name (``eth0``); ledgerd binds an
    address: an interface's IPv4 address, or the value itself when it names none."""
    name = str(value).strip()
    if name not in {n for _i, n in socket.if_nameindex()}:
        return {"listen_address": name}
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", name.encode()[:15]))
        except OSError as exc:
            raise ValueError(f"an interface with an IPv4 address ({name}: "
                             f"{exc.strerror})") from None
    return {"listen_address": socket.inet_ntoa(packed[20:24])}


def _storage_class(value: object) -> dict[str, object]:
    short = str(value).strip().rsplit(".", 1)[-1].lower()
    table = {"dbledgerstorage": "db", "interleavedledgerstorage": "interleaved",
             "sortedledgerstorage": "interleaved", "db": "db", "interleaved": "interleaved"}
    if short not in table:
        raise ValueError("DbLedgerStorage, InterleavedLedgerStorage or SortedLedgerStorage")
    return {"ledger_storage_class": table[short]}


def _scrub_rate(value: object) -> dict[str, object]:
    try:
        rate = float(str(value).strip())
    except ValueError:
        raise ValueError("a number of entries per second") from None
    return {"local_scrub_rate_limit": max(1, round(rate))}


def _pem_only(value: object) -> dict[str, object]:
    if str(value).strip().upper() != "PEM":
        raise ValueError("PEM (ledgerd reads PEM files: convert a JKS or PKCS12 store with "
                         "keytool -importkeystore and openssl pkcs12)")
    return {}


def _log_size(value: object) -> dict[str, object]:
    try:
        size = int(str(value).strip())
    except ValueError:
        raise ValueError("a size in bytes") from None
    return {"log_size_limit": min(size, 1 << 30)}


def _layout(value: object) -> dict[str, object]:
    return {"ledger_manager_type": str(value).strip().lower()}


BOOKIE_NAMES: tuple[BkName, ...] = (
    *ZOOKEEPER_NAMES,
    # -- server (seed 001: Server parameters, NIO server settings) -----------------------
    BkName(name="bookiePort", key="bookie_port"),
    BkName(name="listeningInterface", key="listen_address", convert=_interface_address,
           note="an interface name is bound at its IPv4 address"),
    BkName(name="bookieId", key="bookie_id"),
    BkName(name="advertisedAddress", key="advertised_address"),
    BkName(name="nettyMaxFrameSizeBytes", key="max_frame_bytes", unit="bytes"),
    BkName(name="maxPendingAddRequestsPerThread", key="max_inflight_per_connection"),
    BkName(name="serverWriteBufferHighWaterMark", key="max_reply_bytes_per_connection",
           unit="bytes"),
    BkName(name="serverTcpNoDelay", key="server_tcp_no_delay"),
    BkName(name="bookieDeathWatchInterval",
           why="no death-watch thread: the bookie's tasks run in one trio nursery, so a "
               "failed component stops the process at once"),
    BkName(name="numAddWorkerThreads", why=_ONE_LOOP),
    BkName(name="numReadWorkerThreads", why=_ONE_LOOP),
    BkName(name="numHighPriorityWorkerThreads", why=_ONE_LOOP),
    BkName(name="serverNumIOThreads", why=_ONE_LOOP),
    BkName(name="allowEphemeralPorts",
           why="ledgerd refuses bookie_port = 0: a bookie id is host:port, and a port picked "
               "at start would change it on every restart"),
    # -- directories -------------------------------------------------------------------
    BkName(name="journalDirectory", key="journal_directory"),
    BkName(name="journalDirectories", key="journal_directory", convert=_single_journal,
           note="exactly one directory"),
    BkName(name="journalDir", key="journal_directory", note="BookKeeper 4.0's name"),
    BkName(name="ledgerDirectories", key="ledger_directories", note="comma list"),
    BkName(name="ledgerDir", key="ledger_directories", note="BookKeeper 4.0's name; comma list"),
    BkName(name="indexDirectories", key="index_directories", note="comma list"),
    # -- ledger manager ------------------------------------------------------------------
    BkName(name="ledgerManagerType", key="ledger_manager_type", convert=_layout,
           note="flat or hierarchical (longhierarchical is refused)"),
    # -- journal -------------------------------------------------------------------------
    BkName(name="journalMaxSizeMB", key="journal_max_size_mb", unit="MB"),
    BkName(name="journalMaxBackups", key="journal_max_backups"),
    BkName(name="journalPreAllocSizeMB", key="journal_prealloc_mb", unit="MB"),
    BkName(name="journalWriteBufferSizeKB", key="journal_write_buffer_size_kb", unit="KB"),
    BkName(name="journalAlignmentSize", key="journal_alignment_size", unit="bytes"),
    BkName(name="journalRemoveFromPageCache", key="journal_remove_from_page_cache"),
    BkName(name="journalAdaptiveGroupWrites",
           why="the journal always groups the adds waiting while a sync runs into the "
               "next write (group commit cannot be turned off)"),
    BkName(name="journalMaxGroupWaitMSec", key="journal_max_group_wait_ms", unit="ms"),
    BkName(name="journalBufferedWritesThreshold", key="journal_buffered_writes_threshold",
           unit="bytes"),
    BkName(name="journalBufferedEntriesThreshold", key="journal_buffered_entries_threshold",
           unit="entries"),
    BkName(name="journalFlushWhenQueueEmpty", key="journal_flush_when_queue_empty"),
    BkName(name="numJournalCallbackThreads",
           why="add replies go out from the event loop as soon as their group is durable; "
               "no callback threads"),
    BkName(name="journalReuseFiles", key="journal_reuse_files"),
    BkName(name="skipReplayJournalInvalidRecord", key="journal_skip_invalid_records"),
    BkName(name="journalMaxMemorySizeMb", key="journal_max_memory_mb", unit="MB"),
    BkName(name="journalSyncData", key="journal_sync_data"),
    # -- ledger cache --------------------------------------------------------------------
    BkName(name="openFileLimit", key="open_file_limit", unit="files"),
    BkName(name="pageSize", key="page_size", unit="bytes"),
    BkName(name="pageLimit", key="page_limit", unit="pages"),
    # -- entry logs ----------------------------------------------------------------------
    BkName(name="logSizeLimit", key="log_size_limit", unit="bytes", convert=_log_size,
           note="above 1 GiB (BookKeeper 4.4's default is 2 GB) read as 1 GiB, ledgerd's "
                "largest entry log"),
    BkName(name="entryLogFilePreallocationEnabled", key="entry_log_file_preallocation_enabled"),
    BkName(name="flushEntrylogBytes", key="flush_entrylog_bytes", unit="bytes"),
    BkName(name="readBufferSizeBytes", key="read_buffer_size_bytes", unit="bytes"),
    BkName(name="writeBufferSizeBytes", key="write_buffer_size_bytes", unit="bytes"),
    BkName(name="flushInterval", key="flush_interval_ms", unit="ms"),
    BkName(name="ledgerStorageClass", key="ledger_storage_class", convert=_storage_class,
           note="DbLedgerStorage = db; InterleavedLedgerStorage and SortedLedgerStorage = "
                "interleaved"),
    BkName(name="dbStorage_writeCacheMaxSizeMb", key="db_write_cache_max_size_mb", unit="MB"),
    BkName(name="dbStorage_readAheadCacheMaxSizeMb", key="db_read_ahead_cache_max_size_mb",
           unit="MB"),
    BkName(name="dbStorage_readAheadCacheBatchSize", key="db_read_ahead_batch_size",
           unit="entries"),
    # -- garbage collection and compaction ----------------------------------------------
    BkName(name="gcWaitTime", key="gc_wait_time_ms", unit="ms"),
    BkName(name="minorCompactionInterval", key="minor_compaction_interval_s", unit="s",
           off_at_or_below_zero=True),
    BkName(name="minorCompactionThreshold", key="minor_compaction_threshold",
           off_at_or_below_zero=True),
    BkName(name="majorCompactionInterval", key="major_compaction_interval_s", unit="s",
           off_at_or_below_zero=True),
    BkName(name="majorCompactionThreshold", key="major_compaction_threshold",
           off_at_or_below_zero=True),
    BkName(name="compactionMaxOutstandingRequests", key="compaction_max_outstanding_requests",
           unit="entries"),
    BkName(name="compactionRate", key="compaction_rate", unit="entries/s", weak=True,
           note="compactionRateByEntries wins"),
    BkName(name="compactionRateByEntries", key="compaction_rate", unit="entries/s"),
    BkName(name="compactionRateByBytes", key="compaction_rate_by_bytes", unit="bytes/s"),
    # -- statistics ----------------------------------------------------------------------
    BkName(name="enableStatistics", key="metrics_enabled"),
    BkName(name="prometheusStatsHttpPort", key="admin_port"),
    BkName(name="prometheusStatsHttpAddress", key="admin_address"),
    BkName(name="statsProviderClass",
           why="ledgerd serves Prometheus metrics on its admin endpoint "
               "(prometheusStatsHttpPort = admin_port); no other provider"),
    BkName(name="httpServerEnabled",
           why="ledgerd's admin endpoint (admin_port, BookKeeper's prometheusStatsHttpPort) "
               "always serves /metrics and the admin calls"),
    BkName(name="httpServerPort",
           why="BookKeeper's separate admin HTTP server; ledgerd's one endpoint is "
               "admin_port (BookKeeper's prometheusStatsHttpPort, where Prometheus scrapes)"),
    BkName(name="httpServerHost", why="see httpServerPort: ledgerd's is admin_address"),
    # -- autorecovery --------------------------------------------------------------------
    BkName(name="autoRecoveryDaemonEnabled", key="auto_recovery_daemon_enabled"),
    BkName(name="openLedgerRereplicationGracePeriod",
           key="open_ledger_rereplication_grace_period_ms", unit="ms"),
    BkName(name="lostBookieRecoveryDelay", key="lost_bookie_recovery_delay_s", unit="s"),
    BkName(name="auditorPeriodicCheckInterval", key="auditor_periodic_check_interval_s",
           unit="s", off_at_or_below_zero=True),
    BkName(name="auditorPeriodicBookieCheckInterval",
           key="auditor_periodic_bookie_check_interval_s", unit="s",
           off_at_or_below_zero=True),
    BkName(name="localScrubInterval", key="local_scrub_period_s", unit="s",
           off_at_or_below_zero=True, note="BookKeeper's default is 0 (off), ledgerd's a day"),
    BkName(name="localScrubPeriod", key="local_scrub_period_s", unit="s",
           off_at_or_below_zero=True, note="ledgerd's earlier spelling of localScrubInterval"),
    BkName(name="localScrubRateLimit", key="local_scrub_rate_limit", unit="entries/s",
           convert=_scrub_rate, note="rounded, at least 1"),
    BkName(name="auditorLedgerVerificationPercentage",
           key="local_scrub_verification_percentage", unit="percent"),
    BkName(name="rereplicationEntryBatchSize", key="rereplication_entry_batch_size",
           unit="entries"),
    BkName(name="replicationRateByBytes", key="replication_rate_by_bytes", unit="bytes/s"),
    BkName(name="rwRereplicateBackoffMs", key="rw_rereplicate_backoff_ms", unit="ms"),
    BkName(name="lockReleaseOfFailedLedgerGracePeriod",
           key="lock_release_of_failed_ledger_grace_period_ms", unit="ms"),
    # -- read-only mode and disks ------------------------------------------------------------
    BkName(name="readOnlyModeEnabled", key="read_only_mode_enabled"),
    BkName(name="diskUsageThreshold", key="disk_usage_threshold", unit="fraction"),
    BkName(name="diskUsageLwmThreshold", key="disk_usage_lwm_threshold", unit="fraction"),
    BkName(name="diskCheckInterval", key="disk_check_interval_ms", unit="ms"),
    BkName(name="allowStorageExpansion", key="allow_storage_expansion"),
    # -- TLS -----------------------------------------------------------------------------
    BkName(name="tlsCertificatePath", key="tls_certificate_path"),
    BkName(name="tlsKeyStore", key="tls_key_path", note="a PEM private key"),
    BkName(name="tlsTrustStore", key="tls_trust_path", note="PEM CA certificates"),
    BkName(name="tlsKeyStoreType", key="tls_key_path", convert=_pem_only,
           note="must be PEM; sets nothing"),
    BkName(name="tlsTrustStoreType", key="tls_trust_path", convert=_pem_only,
           note="must be PEM; sets nothing"),
    BkName(name="tlsClientAuthentication", key="tls_client_authentication"),
    BkName(name="tlsEnabledProtocols", key="tls_enabled_protocols"),
    BkName(name="tlsEnabledCipherSuites", key="tls_enabled_cipher_suites"),
    BkName(name="tlsCertFilesRefreshDurationSeconds", key="tls_cert_refresh_seconds",
           unit="s"),
)
