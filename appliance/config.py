"""Bookie configuration: one frozen dataclass, keys one-to-one with BookKeeper's.

Loaded with :func:`ledgerd.base.settings.load_config` (TOML file, then ``LEDGERD_<KEY>``, then
CLI flags). Defaults come from the seed documents and BookKeeper's
``ServerConfiguration``; where ledgerd differs on purpose the description says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ledgerd.appliance.bknames import BOOKIE_NAMES
from ledgerd.base.bknames import BkName
from ledgerd.base.credentials import read_cluster_secret
from ledgerd.base.logs import LOG_FORMATS
from ledgerd.base.settings import LOG_LEVELS, ConfigError, setting
from ledgerd.machines.placement import RACK
from ledgerd.metadata.settings import ZooKeeperSettings

if TYPE_CHECKING:  # imported where built: reading a config needs no native helper
    from ledgerd.appliance.gc import GcOptions
    from ledgerd.appliance.scrubber import ScrubOptions
    from ledgerd.disk.journal import JournalOptions
    from ledgerd.disk.storage import StorageOptions

__all__ = ["BookieConfig"]

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieConfig(ZooKeeperSettings):
    """Settings of one bookie process (``ledgerd bookie --conf FILE``)."""

    bookkeeper_names: ClassVar[tuple[BkName, ...]] = BOOKIE_NAMES

    # -- server ---------------------------------------------------------------------
    bookie_port: int = setting(
        3181, bk="bookiePort", minimum=1, maximum=65535,
        why_minimum="0 would pick a new port, and so a new bookie id, on every restart: "
                    "the bookie would not match its own cookie",
        doc="TCP port the bookie serves the protocol on. Fixed: a bookie's id is its "
            "host:port, so a port picked at start (0) would change the id on every "
            "restart, and the bookie would no longer match its own cookie (refused, as "
            "BookKeeper refuses it without allowEphemeralPorts).")
    listen_address: str = setting(
        "127.0.0.1", bk="listeningInterface",
        doc="Address the bookie binds; set the host's address to serve other machines.")
    bookie_id: str = setting(
        "", bk="bookieId",
        doc="Identity registered in ZooKeeper; empty means advertised host:port.")
    advertised_address: str = setting(
        "", bk="advertisedAddress",
        doc="Host other machines use to reach this bookie; empty means listen_address.")
    max_frame_bytes: int = setting(
        8 * MiB, bk="nettyMaxFrameSizeBytes", minimum=1024, maximum=GiB,
        doc="Largest frame accepted; larger ones get BAD_REQUEST and the connection closes.")
    max_inflight_per_connection: int = setting(
        1024, bk="maxPendingAddRequestsPerThread", minimum=1,
        doc="Requests in flight per connection before the bookie stops reading it.")
    max_reply_bytes_per_connection: int = setting(
        16 * MiB, bk="serverWriteBufferHighWaterMark", minimum=64 * 1024, maximum=GiB,
        doc="Replies built and not yet sent on one connection before the bookie stops "
            "taking its requests (a peer that does not read stalls only itself).")
    max_connections: int = setting(
        4096, bk="(ledgerd)", minimum=1,
        doc="Open client connections; more are closed at once (counted in "
            "ledgerd_bookie_connections_refused). Keep below the open-file limit.")
    connection_idle_timeout_s: float = setting(
        600.0, bk="(ledgerd)", minimum=0,
        doc="Close a connection with nothing in flight after this long without a "
            "request (0 = never); clients reconnect on their next request.")
    connection_hub_enabled: bool = setting(
        True, bk="(ledgerd)",
        doc="Serve plain TCP connections from one task over an epoll set (one wake-up "
            "serves every connection with data; add replies go out from the journal's "
            "syncer as soon as their group is durable). false: a reader and a writer "
            "task per connection.")
    server_tcp_no_delay: bool = setting(
        True, bk="serverTcpNoDelay", doc="Disable Nagle's algorithm on bookie sockets.")
    # -- directories ---------------------------------------------------------------
    journal_directory: str = setting(
        "/var/lib/ledgerd/journal", bk="journalDirectory",
        doc="Write-ahead journal directory, ideally on a dedicated device.")
    ledger_directories: tuple[str, ...] = setting(
        ("/var/lib/ledgerd/ledgers",), bk="ledgerDirectories",
        doc="Directories for entry logs; new logs go to the least full writable one.")
    index_directories: tuple[str, ...] = setting(
        (), bk="indexDirectories", doc="Directories for index files; empty means the ledger dirs.")
    # -- metadata (zk_servers, zk_timeout_ms, zk_ledgers_root_path: ZooKeeperSettings) --
    ledger_manager_type: str = setting(
        "hierarchical", bk="ledgerManagerType", choices=("flat", "hierarchical"),
        doc="Ledger metadata layout the cluster must use; the bookie refuses another.")
    # -- journal -------------------------------------------------------------------
    journal_max_size_mb: int = setting(
        2048, bk="journalMaxSizeMB", minimum=1, maximum=1 << 20,
        doc="A journal file rolls over when it reaches this size.")
    journal_max_backups: int = setting(
        5, bk="journalMaxBackups", minimum=0,
        doc="Journal files older than the last mark kept after a checkpoint.")
    journal_prealloc_mb: int = setting(
        16, bk="journalPreAllocSizeMB", minimum=1, maximum=1024,
        doc="Journal space kept pre-zeroed ahead of the write position (topped up 1 MiB at "
            "a time, in paced 128 KiB writes, as groups use it).")
    journal_write_buffer_size_kb: int = setting(
        64, bk="journalWriteBufferSizeKB", minimum=4, maximum=1 << 20,
        doc="Initial size of the journal's aligned write buffer (one buffer, reused; it "
            "grows to the largest group written).")
    journal_alignment_size: int = setting(
        4096, bk="journalAlignmentSize", choices=None, minimum=512, maximum=65536,
        doc="Group writes are padded to this size; 4096 matches the physical block (BK: 512).")
    journal_remove_from_page_cache: bool = setting(
        True, bk="journalRemoveFromPageCache",
        doc="Drop written journal pages from the page cache (buffered fallback only).")
    journal_max_group_wait_ms: float = setting(
        0.0, bk="journalMaxGroupWaitMSec", minimum=0, maximum=1000,
        doc="Longest an add waits for its group to fill before the group is written. 0 "
            "(the default; BookKeeper's is 2): a group is written as soon as the disk is "
            "free, and what arrives during its sync forms the next group, so groups grow "
            "with load by themselves (bench/latency.py: 5x one-writer throughput, half "
            "the light-load p99; a wait makes larger groups near saturation).")
    journal_groups_in_flight: int = setting(
        1, bk="(ledgerd; BookKeeper has one journal thread)", minimum=1, maximum=16,
        doc="Groups written and synced at once, each by its own native thread; they "
            "complete (and are acknowledged) in the order they were started. 1, like "
            "BookKeeper: measured here (bench/RESULTS.md), 2 did not lower the open-loop "
            "p99 at 10% or 50% load, where the event loop, not the sync, is the limit. "
            "More may help a disk whose syncs are slow next to the CPU's work per add. "
            "Caveat: after a power loss during overlapping syncs, an older group can be "
            "torn while a newer one is whole; replay then refuses to start (a bad record "
            "with valid ones after it) until journal_skip_invalid_records is set. None "
            "of those records were acknowledged.")
    journal_buffered_writes_threshold: int = setting(
        512 * 1024, bk="journalBufferedWritesThreshold", minimum=0,
        doc="Write the group once this many bytes are waiting.")
    journal_buffered_entries_threshold: int = setting(
        0, bk="journalBufferedEntriesThreshold", minimum=0,
        doc="Write the group once this many entries are waiting (0 = off).")
    journal_flush_when_queue_empty: bool = setting(
        False, bk="journalFlushWhenQueueEmpty",
        doc="Write the group as soon as the queue is empty.")
    journal_reuse_files: bool = setting(
        False, bk="journalReuseFiles",
        doc="Recycle old journal files (already zeroed) instead of creating new ones.")
    journal_skip_invalid_records: bool = setting(
        False, bk="skipReplayJournalInvalidRecord",
        doc="Skip a corrupt journal record at replay instead of refusing to start.")
    journal_max_memory_mb: int = setting(
        256, bk="journalMaxMemorySizeMb", minimum=1,
        doc="Bytes waiting in the journal beyond which adds get TOO_MANY_REQUESTS.")
    journal_sync_data: bool = setting(
        True, bk="journalSyncData",
        doc="fdatasync each group before replying (false risks acknowledged data).")
    # -- entry logs and index ------------------------------------------------------
    log_size_limit: int = setting(
        GiB, bk="logSizeLimit", minimum=64 * 1024, maximum=GiB,
        doc="An entry log rolls over at this size (at most 1 GiB).")
    entry_log_file_preallocation_enabled: bool = setting(
        True, bk="entryLogFilePreallocationEnabled",
        doc="Create the next entry log (file, header, lastId) in the writer thread "
            "while the current one fills, so a roll does not wait for it.")
    flush_entrylog_bytes: int = setting(
        MiB, bk="flushEntrylogBytes", minimum=0, maximum=GiB,
        doc="Start writing an entry log's data out to disk every this many bytes "
            "(sync_file_range, no wait; 0 = off), so the checkpoint's fdatasync finds "
            "little to flush: on a disk the journal shares, a checkpoint that flushed "
            "seconds of entries at once held the journal's syncs (and every add) behind "
            "it. Not a durability step: the checkpoint still syncs. BookKeeper's default "
            "is 0. 1 MiB (bench/RESULTS.md): with none, the open-loop p99 at half load "
            "was 18-63 ms; with 8 MiB, 7-11 ms, and each 8 MiB write-out held the "
            "journal's syncs for 6-8 ms; with 1 MiB, 3.5-5.4 ms.")
    write_buffer_size_bytes: int = setting(
        64 * 1024, bk="writeBufferSizeBytes", minimum=512,
        doc="Entry log write buffer; entries still in it are readable.")
    read_buffer_size_bytes: int = setting(
        512, bk="readBufferSizeBytes", minimum=64, maximum=1 << 20,
        doc="Bytes an entry-log read takes with the record header in one pread: an "
            "entry up to this size minus 8 is read with one system call, a larger one "
            "with two.")
    flush_interval_ms: int = setting(
        10000, bk="flushInterval", minimum=10,
        doc="Checkpoint period: flush entry logs and index, then persist the last mark.")
    ledger_storage_class: str = setting(
        "interleaved", bk="ledgerStorageClass", choices=("interleaved", "db"),
        doc="interleaved: an index file per ledger (pages cached by page_size/page_limit); "
            "db: one embedded index store (LMDB) for every ledger, for hundreds of "
            "thousands of ledgers per bookie (BookKeeper's DbLedgerStorage). Existing data "
            "is converted with 'ledgerd shell convertstorage'.")
    db_write_cache_max_size_mb: int = setting(
        -1, bk="dbStorage_writeCacheMaxSizeMb", minimum=-1,
        doc="db storage: memory for entries waiting for a checkpoint, which writes them "
            "sorted by ledger (two halves: one filling, one being written). Past half, "
            "adds write straight to the entry log. -1: a sixteenth of the host's memory, "
            "at most 1 GiB (BookKeeper: a quarter of direct memory).")
    db_read_ahead_cache_max_size_mb: int = setting(
        -1, bk="dbStorage_readAheadCacheMaxSizeMb", minimum=-1,
        doc="db storage: memory for entries read ahead. -1: a thirty-second of the "
            "host's memory, at most 512 MiB.")
    db_read_ahead_batch_size: int = setting(
        100, bk="dbStorage_readAheadCacheBatchSize", minimum=0, maximum=10000,
        doc="db storage: entries a read that misses the caches reads ahead of the one "
            "asked for (one read of at most 1 MiB of the entry log); 0 turns it off.")
    page_size: int = setting(
        8192, bk="pageSize", minimum=512, maximum=1 << 20,
        doc="Index page size in bytes (page_size / 8 entries per page).")
    page_limit: int = setting(
        -1, bk="pageLimit", minimum=-1,
        doc="Index pages held in memory; -1 means a third of the host's memory (at most "
            "4 GiB) worth of pages, as BookKeeper sizes it from a third of direct memory.")
    open_file_limit: int = setting(
        20000, bk="openFileLimit", minimum=16,
        doc="Index and entry-log files kept open for reading at once (least recently used "
            "closed first); the logs being written and the journal are apart.")
    # -- garbage collection and compaction ----------------------------------------
    gc_wait_time_ms: int = setting(
        600000, bk="gcWaitTime", minimum=1000,
        doc="Period of the garbage collector.")
    minor_compaction_interval_s: int = setting(
        3600, bk="minorCompactionInterval", minimum=0,
        doc="Minor compaction period (0 = off).")
    minor_compaction_threshold: float = setting(
        0.2, bk="minorCompactionThreshold", minimum=0.0, maximum=1.0,
        doc="Entry logs with less live data than this fraction are minor-compacted.")
    major_compaction_interval_s: int = setting(
        86400, bk="majorCompactionInterval", minimum=0,
        doc="Major compaction period (0 = off).")
    major_compaction_threshold: float = setting(
        0.8, bk="majorCompactionThreshold", minimum=0.0, maximum=1.0,
        doc="Entry logs with less live data than this fraction are major-compacted.")
    compaction_rate: int = setting(
        1000, bk="compactionRateByEntries", minimum=1,
        doc="Entries re-added per second by compaction.")
    compaction_rate_by_bytes: int = setting(
        0, bk="compactionRateByBytes", minimum=0,
        doc="Bytes re-added per second by compaction (0 = no byte limit); both rates "
            "hold when both are set.")
    compaction_max_outstanding_requests: int = setting(
        100000, bk="compactionMaxOutstandingRequests", minimum=1,
        doc="Entries compacted before the entry log is flushed and the index updated.")
    # -- disks and read-only mode --------------------------------------------------
    read_only_mode_enabled: bool = setting(
        True, bk="readOnlyModeEnabled",
        doc="Go read-only on a full disk or storage failure; false means shut down.")
    disk_usage_threshold: float = setting(
        0.95, bk="diskUsageThreshold", minimum=0.0, maximum=1.0,
        doc="Disk use fraction at which a directory counts as full.")
    disk_usage_lwm_threshold: float = setting(
        0.90, bk="diskUsageLwmThreshold", minimum=0.0, maximum=1.0,
        doc="Disk use fraction below which a full directory is writable again.")
    disk_check_interval_ms: int = setting(
        10000, bk="diskCheckInterval", minimum=10, doc="Period of the disk checker.")
    allow_storage_expansion: bool = setting(
        False, bk="allowStorageExpansion",
        doc="Accept new empty ledger or index directories added to the configured set "
            "at start (their cookies, and ZooKeeper's, are rewritten); a directory "
            "removed or swapped is still refused.")
    # -- autorecovery --------------------------------------------------------------
    auto_recovery_daemon_enabled: bool = setting(
        False, bk="autoRecoveryDaemonEnabled",
        doc="Run the auditor and replication worker inside the bookie.")
    open_ledger_rereplication_grace_period_ms: int = setting(
        30000, bk="openLedgerRereplicationGracePeriod", minimum=0,
        doc="Wait before fencing an open ledger's last fragment to re-replicate it.")
    lost_bookie_recovery_delay_s: int = setting(
        0, bk="lostBookieRecoveryDelay", minimum=0,
        doc="Wait before the auditor marks a lost bookie's ledgers underreplicated (the "
            "cluster-wide value lives in ZooKeeper once an auditor ran; see "
            "`ledgerd shell lostbookierecoverydelay`).")
    cluster_secret_file: str = setting(
        "", bk="(ledgerd)",
        doc="File with the cluster secret (same on every bookie and autorecovery host, mode "
            "600): recovery writes are accepted with credentials derived from it. Empty = "
            "this bookie accepts no recovery credential and autorecovery cannot run.")
    bookie_rack: str = setting(
        "/default-rack", bk="(bookie rack in the DNS-to-switch mapping)",
        doc="Failure domain of this bookie, e.g. /zone-a/rack-3; placement spreads each "
            "write set across racks when enough exist.")
    auditor_periodic_check_interval_s: int = setting(
        604800, bk="auditorPeriodicCheckInterval", minimum=0,
        doc="Period of the auditor's check of every ledger's first and last entry per "
            "bookie (0 = off).")
    auditor_periodic_bookie_check_interval_s: int = setting(
        86400, bk="auditorPeriodicBookieCheckInterval", minimum=0,
        doc="Period of the auditor's scan for ledgers that reference lost bookies "
            "(0 = only at start).")
    auditor_check_reads_per_s: int = setting(
        200, bk="(ledgerd; auditor read throttle)", minimum=1,
        doc="Reads per second the periodic check may send, in all.")
    auditor_metadata_reads_per_s: int = setting(
        1000, bk="(ledgerd; auditor metadata throttle)", minimum=1,
        doc="Ledger metadata reads per second the auditor's scans may make.")
    local_scrub_period_s: int = setting(
        86400, bk="localScrubInterval", minimum=0,
        doc="Period of the scrubber, which reads back every entry this bookie should hold "
            "by the ledgers' metadata and marks ledgers missing some under-replicated; a "
            "pass also runs at start (0 = off).")
    local_scrub_rate_limit: int = setting(
        1000, bk="localScrubRateLimit", minimum=1,
        doc="Entries per second the scrubber reads.")
    local_scrub_verification_percentage: int = setting(
        100, bk="auditorLedgerVerificationPercentage", minimum=0, maximum=100,
        doc="Share of the expected entries each scrub pass reads, sampled at random "
            "(100 = every entry).")
    auditor_durability_interval_s: int = setting(
        60, bk="(ledgerd)", minimum=0,
        doc="Period of the auditor's durability report: entries and bytes below Qw, "
            "held by one bookie only, the oldest under-replicated age and the time to "
            "full redundancy, as ledgerd_durability_* metrics (0 = off).")
    rereplication_entry_batch_size: int = setting(
        256, bk="rereplicationEntryBatchSize", minimum=1, maximum=65536,
        doc="Entries copied per read/write round trip when re-replicating.")
    rereplication_outstanding_batches: int = setting(
        16, bk="(ledgerd)", minimum=1, maximum=256,
        doc="Batches one ledger copy keeps in flight (memory: this x the batch's bytes).")
    replication_rate_by_bytes: int = setting(
        -1, bk="replicationRateByBytes", minimum=-1,
        doc="Bytes per second one worker may copy (-1 = unlimited).")
    replication_workers: int = setting(
        2, bk="(ledgerd; BookKeeper runs one worker per process)", minimum=1, maximum=64,
        doc="Ledgers one autorecovery process re-replicates at once.")
    rw_rereplicate_backoff_ms: int = setting(
        5000, bk="rwRereplicateBackoffMs", minimum=0,
        doc="Pause of a replication worker after a failed or empty round.")
    lock_release_of_failed_ledger_grace_period_ms: int = setting(
        300000, bk="lockReleaseOfFailedLedgerGracePeriod", minimum=0,
        doc="Cap of the growing time a worker keeps a ledger it failed on locked.")
    # -- admin and metrics ---------------------------------------------------------
    admin_address: str = setting(
        "127.0.0.1", bk="prometheusStatsHttpAddress", doc="Address of the metrics/admin HTTP endpoint.")
    admin_port: int = setting(
        8000, bk="prometheusStatsHttpPort", minimum=0, maximum=65535,
        doc="Port of the metrics/admin HTTP endpoint (0 = pick a free port).")
    metrics_enabled: bool = setting(
        True, bk="enableStatistics", doc="Serve Prometheus metrics on the admin endpoint.")
    event_loop_stall_ms: int = setting(
        100, bk="(ledgerd)", minimum=10, maximum=60000,
        doc="An event-loop lag this long is logged (event_loop_stalled), and while the "
            "loop is held that long a watchdog thread logs the loop thread's Python stack "
            "(event_loop_held): what held it.")
    admin_secret: str = setting(
        "", bk="(ledgerd)",
        doc="Token every state-changing admin request must carry (HTTP: Authorization: "
            "Bearer, or X-Ledgerd-Secret; the wire's admin calls: their secret field), "
            "loopback included; empty (and no admin_secret_file) = loopback only, no token. "
            "Prefer admin_secret_file: a config file is often world-readable.")
    admin_secret_file: str = setting(
        "", bk="(ledgerd)",
        doc="File holding the admin token (its first line); wins over admin_secret. Never "
            "logged.")
    # -- TLS and authorization ------------------------------------------------------
    tls_certificate_path: str = setting(
        "", bk="tlsCertificatePath",
        doc="PEM certificate chain of this bookie; set, it turns TLS on: clients upgrade a "
            "connection with START_TLS on bookie_port (BookKeeper's way, one port).")
    tls_key_path: str = setting(
        "", bk="tlsKeyStore (PEM)", doc="PEM private key of tls_certificate_path.")
    tls_trust_path: str = setting(
        "", bk="tlsTrustStore (PEM)",
        doc="PEM CA certificates that client certificates must chain to (mutual TLS); "
            "also what this bookie's own autorecovery trusts in other bookies.")
    tls_client_authentication: bool = setting(
        False, bk="tlsClientAuthentication",
        doc="Require a client certificate from tls_trust_path's CA (mutual TLS); false "
            "still verifies one a client offers.")
    tls_required: bool = setting(
        False, bk="(ledgerd)",
        doc="Serve TLS connections only: a connection whose first request is not "
            "START_TLS is answered TLS_REQUIRED and closed.")
    tls_enabled_protocols: str = setting(
        "TLSv1.2,TLSv1.3", bk="tlsEnabledProtocols",
        doc="TLS versions allowed (comma list; the lowest and highest named count).")
    tls_enabled_cipher_suites: str = setting(
        "", bk="tlsEnabledCipherSuites",
        doc="OpenSSL cipher list for TLS 1.2 (empty: Python's defaults; TLS 1.3 suites "
            "are not configurable in Python).")
    tls_cert_refresh_seconds: int = setting(
        0, bk="tlsCertFilesRefreshDurationSeconds", minimum=0,
        doc="Re-read the certificate, key and trust files when they change, checked at "
            "most this often (0 = never); open connections keep their session.")
    authorization_enabled: bool = setting(
        False, bk="bookieAuthProviderFactoryClass = BookieAuthZFactory",
        doc="Check every request against its principal's roles (client, recovery, "
            "admin, bookie): from the client certificate's OU 0:role,... as BookKeeper's "
            "CertUtils writes it, else anonymous_roles. Refused requests get "
            "UNAUTHORIZED and a log line naming the principal.")
    principals_file: str = setting(
        "", bk="(ledgerd)",
        doc="TOML file of principals that authenticate with a token instead of a client "
            "certificate ([principals.NAME] token_sha256 = hex, roles = [...]; "
            "`ledgerd shell gentoken` writes an entry); read at start.")
    anonymous_roles: tuple[str, ...] = setting(
        (), bk="(ledgerd)",
        doc="Roles of a connection without a client certificate when "
            "authorization_enabled (empty: such a connection can do nothing).")
    log_level: str = setting(
        "INFO", bk="(log4j level)", choices=LOG_LEVELS, doc="Logging level.")
    log_levels: tuple[tuple[str, str], ...] = setting(
        (), bk="(log4j.logger.NAME)",
        doc='Levels of single loggers over log_level, as log4j.logger.NAME lines set them: '
            '{"ledgerd.disk.journal" = "DEBUG", "kazoo" = "WARNING"} (a logger\'s '
            'children follow it; environment: name=LEVEL,name=LEVEL).')
    log_file: str = setting(
        "", bk="(log4j file appender)",
        doc="Also write the log lines to this file, appended; reopened when it is moved "
            "or removed (logrotate), so no copytruncate is needed. Empty: stderr only "
            "(the journal, under systemd).")
    log_format: str = setting(
        "kv", bk="(ledgerd)", choices=LOG_FORMATS,
        doc="Log lines as key=value (kv) or one JSON object a line (json); "
            "`ledgerd --log-format` overrides it.")

    def __post_init__(self) -> None:
        if self.bookie_port == 0:  # (BookieConfig(...) directly; load_config's range says so)
            raise ConfigError("bookie_port", 0, "a fixed port, 1 to 65535 (0 would pick a "
                              "new port, and so a new bookie id, on every restart)")
        if not RACK.match(self.bookie_rack):
            raise ConfigError("bookie_rack", self.bookie_rack,
                              "a path like /rack-1 or /zone-a/rack-3 (letters, digits, . _ -)")
        if not self.ledger_directories:
            raise ConfigError("ledger_directories", self.ledger_directories,
                              "at least one directory")
        if self.auto_recovery_daemon_enabled and not self.cluster_secret_file:
            raise ConfigError("cluster_secret_file", "",
                              "a file with the cluster secret when auto_recovery_daemon_enabled "
                              "is true (autorecovery writes with credentials derived from it)")
        if self.disk_usage_lwm_threshold > self.disk_usage_threshold:
            raise ConfigError(
                "disk_usage_lwm_threshold", self.disk_usage_lwm_threshold,
                f"a value <= disk_usage_threshold ({self.disk_usage_threshold})")
        if self.journal_alignment_size & (self.journal_alignment_size - 1):
            raise ConfigError("journal_alignment_size", self.journal_alignment_size,
                              "a power of two between 512 and 65536")
        for name, level in self.log_levels:
            if not name or level not in LOG_LEVELS:
                raise ConfigError("log_levels", dict(self.log_levels),
                                  'a table of logger name = level, levels one of '
                                  + ", ".join(LOG_LEVELS))
        if self.page_size % 8:
            raise ConfigError("page_size", self.page_size, "a multiple of 8")
        if self.tls_required and not self.tls_certificate_path:
            raise ConfigError("tls_required", True, "tls_certificate_path set (TLS on)")
        if self.tls_client_authentication and not self.tls_trust_path:
            raise ConfigError("tls_client_authentication", True,
                              "tls_trust_path set (the CA client certificates must chain to)")
        try:
            from ledgerd.appliance.authz import parse_roles

            parse_roles(self.anonymous_roles, "anonymous_roles")
        except ValueError as exc:
            raise ConfigError("anonymous_roles", list(self.anonymous_roles), str(exc)) from None
        if self.local_scrub_period_s > 0 and self.local_scrub_verification_percentage == 0:
            raise ConfigError("local_scrub_verification_percentage", 0,
                              "1..100 while local_scrub_period_s is set (a pass that reads "
                              "nothing proves nothing; local_scrub_period_s = 0 turns the "
                              "scrubber off)")
        if 0 < self.minor_compaction_interval_s and 0 < self.major_compaction_interval_s \
                and self.minor_compaction_interval_s >= self.major_compaction_interval_s:
            raise ConfigError(
                "minor_compaction_interval_s", self.minor_compaction_interval_s,
                f"less than major_compaction_interval_s ({self.major_compaction_interval_s})")

    def admin_token(self) -> str:
        """The admin token: admin_secret_file's first line, else admin_secret."""
        if not self.admin_secret_file:
            return self.admin_secret
        try:
            with open(self.admin_secret_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ConfigError("admin_secret_file", self.admin_secret_file,
                              f"a readable file ({exc.strerror})") from None
        if not token:
            raise ConfigError("admin_secret_file", self.admin_secret_file,
                              "a file whose first line is the token")
        return token

    def cluster_secret(self) -> bytes:
        """The cluster secret's bytes (b"" when ``cluster_secret_file`` is empty);
        ConfigError naming the file when it cannot be used."""
        if not self.cluster_secret_file:
            return b""
        return read_cluster_secret(self.cluster_secret_file)

    @property
    def effective_bookie_id(self) -> str:
        """The id the bookie registers under: ``bookie_id``, else advertised host:port."""
        return self.bookie_id or \
            f"{self.advertised_address or self.listen_address}:{self.bookie_port}"

    @property
    def effective_index_directories(self) -> tuple[str, ...]:
        return self.index_directories or self.ledger_directories

    # -- what the bookie's parts are built with ----------------------------------------

    def journal_options(self) -> JournalOptions:
        from ledgerd.disk.journal import JournalOptions

        return JournalOptions(
            max_group_wait_ms=self.journal_max_group_wait_ms,
            buffered_writes_threshold=self.journal_buffered_writes_threshold,
            buffered_entries_threshold=self.journal_buffered_entries_threshold,
            flush_when_queue_empty=self.journal_flush_when_queue_empty,
            max_size_mb=self.journal_max_size_mb,
            prealloc_mb=self.journal_prealloc_mb,
            alignment=self.journal_alignment_size,
            max_backups=self.journal_max_backups,
            reuse_files=self.journal_reuse_files,
            sync_data=self.journal_sync_data,
            max_memory_bytes=self.journal_max_memory_mb * MiB,
            remove_from_page_cache=self.journal_remove_from_page_cache,
            write_buffer_size=self.journal_write_buffer_size_kb * 1024,
            groups_in_flight=self.journal_groups_in_flight,
        )

    def storage_options(self) -> StorageOptions:
        from ledgerd.disk.storage import StorageOptions

        return StorageOptions(
            journal_dir=Path(self.journal_directory),
            ledger_dirs=tuple(Path(d) for d in self.ledger_directories),
            index_dirs=tuple(Path(d) for d in self.effective_index_directories),
            journal=self.journal_options(),
            log_size_limit=self.log_size_limit,
            write_buffer_size=self.write_buffer_size_bytes,
            page_size=self.page_size,
            page_limit=self.page_limit,
            flush_interval_ms=self.flush_interval_ms,
            skip_invalid_journal_records=self.journal_skip_invalid_records,
            open_file_limit=self.open_file_limit,
            preallocate_entry_logs=self.entry_log_file_preallocation_enabled,
            flush_entrylog_bytes=self.flush_entrylog_bytes,
            allow_storage_expansion=self.allow_storage_expansion,
            read_buffer_size=self.read_buffer_size_bytes,
            ledger_storage_class=self.ledger_storage_class,
            write_cache_max_bytes=_memory_share(self.db_write_cache_max_size_mb, 16, 1 << 30),
            read_cache_max_bytes=_memory_share(self.db_read_ahead_cache_max_size_mb, 32,
                                               512 << 20),
            read_ahead_batch=self.db_read_ahead_batch_size,
        )

    def scrub_options(self) -> ScrubOptions:
        from ledgerd.appliance.scrubber import ScrubOptions

        return ScrubOptions(period_s=float(self.local_scrub_period_s),
                            rate_per_s=float(self.local_scrub_rate_limit),
                            percentage=float(self.local_scrub_verification_percentage),
                            metadata_reads_per_s=float(self.auditor_metadata_reads_per_s))

    def gc_options(self) -> GcOptions:
        from ledgerd.appliance.gc import GcOptions

        return GcOptions(wait_s=self.gc_wait_time_ms / 1000.0,
                         minor_interval_s=float(self.minor_compaction_interval_s),
                         minor_threshold=self.minor_compaction_threshold,
                         major_interval_s=float(self.major_compaction_interval_s),
                         major_threshold=self.major_compaction_threshold,
                         rate=self.compaction_rate,
                         rate_bytes=self.compaction_rate_by_bytes,
                         max_outstanding=self.compaction_max_outstanding_requests)


def _memory_share(mb: int, divisor: int, cap: int) -> int:
    """``mb`` MiB, or for -1 the host's memory / ``divisor`` up to ``cap`` bytes."""
    if mb >= 0:
        return mb * MiB
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 1 << 30
    return max(MiB, min(memory // divisor, cap))
