"""BookKeeper's configuration names, and how ledgerd reads each one.

An operator coming from BookKeeper brings a ``bk_server.conf`` (or pastes its lines into
a ledgerd TOML file). Each name in it is one of:

* **mapped**: a :class:`BkName` with a ``key`` sets that ledgerd setting, the value
  read in *BookKeeper's* unit and converted to the key's (``readTimeout = 30`` is 30
  seconds, so ``read_timeout_ms = 30000``), BookKeeper's spellings of values translated
  (``digestType = MAC`` is ``hmac``; ``<= 0`` is "off" where BookKeeper reads it so);
* **ignored, with a reason**: a :class:`BkName` with ``why``: this design has no use for
  it (``numAddWorkerThreads``: one event loop serves every connection), said in one
  warning line, never refused;
* **known to BookKeeper, unused here**: any other name of BookKeeper's
  ``ServerConfiguration``/``ClientConfiguration`` or its shipped ``bk_server.conf``
  (:data:`BOOKKEEPER_NAMES`): accepted with a warning;
* **unknown**: a typo, refused like an unknown ledgerd key (with "did you mean").

Each configuration class carries its table as ``bookkeeper_names`` (the ZooKeeper
names in ``metadata/settings.py``, the bookie's in ``appliance/bknames.py``, the
client's in ``ledgerd/config.py``); ``base/settings.py`` applies it and
docs/configuration.md prints it (a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["BOOKKEEPER_NAMES", "CLIENT_ONLY_NAMES", "STREAM_PREFIXES", "BkName", "bk_table", "known_reason",
           "metadata_service_uri"]

Convert = Callable[[object], Mapping[str, object]]


@dataclass(frozen=True, slots=True, kw_only=True)
class BkName:
    """How ledgerd reads one BookKeeper configuration name."""

    name: str
    key: str = ""  # the ledgerd setting it sets ("" = ignored, see why)
    unit: str = ""  # BookKeeper's unit ("s", "ms", "MB", ...), for the docs
    scale: float = 1.0  # ledgerd's value = BookKeeper's x scale
    off_at_or_below_zero: bool = False  # BookKeeper reads <= 0 as off; ledgerd's off is 0
    values: tuple[tuple[str, str], ...] = ()  # BookKeeper's value (lower case) -> ledgerd's
    also: tuple[str, ...] = ()  # more settings it sets (same value, or what convert sets)
    weak: bool = False  # a fallback: another name setting the same key wins in its file
    convert: Convert | None = None  # a value -> {key: value}, for names that set several
    note: str = ""  # how the value is read, when more than a unit (docs)
    why: str = ""  # why an ignored name is ignored

    def __post_init__(self) -> None:
        if bool(self.key) == bool(self.why):
            raise ValueError(f"{self.name}: give a key or a reason to ignore it, not both")

    @property
    def is_ignored(self) -> bool:
        return not self.key

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key, *self.also) if self.key else ()

    def translate(self, value: object) -> dict[str, object]:
        """{ledgerd key: value in ledgerd's unit}; ValueError saying what is allowed."""
        if self.is_ignored:
            return {}
        if self.convert is not None:
            return dict(self.convert(value))
        v: object = value
        if self.values:
            text = str(v).strip().lower()
            table = {k.lower(): x for k, x in self.values}
            if text not in table:
                raise ValueError("one of " + ", ".join(k for k, _ in self.values))
            v = table[text]
        if self.scale != 1.0 or self.off_at_or_below_zero:
            num = _number(v)
            if self.off_at_or_below_zero and num <= 0:
                num = 0
            num = num * self.scale
            v = int(num) if float(num).is_integer() else num
        return {k: v for k in self.keys}

    def describe(self, fields: Iterable[str] | None = None) -> str:
        """One docs cell: what ledgerd does with this name (``fields``: the keys of
        the class the table belongs to; a key it lacks is left out)."""
        if self.is_ignored:
            return f"ignored: {self.why}"
        known = set(self.keys if fields is None else fields)
        parts = [", ".join(f"`{k}`" for k in self.keys if k in known)]
        if self.unit:
            factor = "" if self.scale == 1.0 else f", x {self.scale:g}"
            parts.append(f"BookKeeper's unit: {self.unit}{factor}")
        if self.off_at_or_below_zero:
            parts.append("<= 0 is off (0)")
        if self.values:
            parts.append(", ".join(f"{a} = {b}" for a, b in self.values))
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


def _number(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("a number")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 0)
        except ValueError:
            try:
                return float(value.strip())
            except ValueError:
                pass
    raise ValueError("a number")


def bk_table(names: tuple[BkName, ...]) -> dict[str, BkName]:
    """{name: BkName}; a later entry replaces an earlier one of the same name."""
    return {n.name: n for n in names}


def metadata_service_uri(value: object) -> dict[str, object]:
    """BookKeeper's ``metadataServiceUri`` (``zk+hierarchical://h1:2181;h2:2181/ledgers``)
    as ledgerd's zk_servers, zk_ledgers_root_path and ledger_manager_type."""
    text = str(value).strip()
    scheme, sep, rest = text.partition("://")
    kind, _, layout = scheme.partition("+")
    if not sep or kind != "zk":
        raise ValueError("a zk:// or zk+<layout>:// URI (ledgerd keeps its metadata in "
                         "ZooKeeper)")
    hosts, slash, path = rest.partition("/")
    if not hosts:
        raise ValueError("zk://host:port[;host:port...]/root")
    out: dict[str, object] = {"zk_servers": hosts.replace(";", ","),
                              "zk_ledgers_root_path": "/" + path.rstrip("/") if slash and path
                              else "/ledgers"}
    if layout and layout != "null":
        out["ledger_manager_type"] = layout
    return out


# Name prefixes of BookKeeper's stream storage (table service), which the shipped
# bk_server.conf configures beside the bookie's own keys.
STREAM_PREFIXES = ("dlog.", "storage.", "storageserver.")

# Every name of BookKeeper's ServerConfiguration, ClientConfiguration and
# AbstractConfiguration, and every key of its shipped conf/bk_server.conf (commented or
# not): names an operator's file may hold that are no typo.
BOOKKEEPER_NAMES = frozenset("""
    addEntryQuorumTimeoutSec addEntryTimeoutSec advertisedAddress
    allocatorExitOnOutOfMemory allocatorLeakDetectionPolicy allocatorOutOfMemoryPolicy
    allocatorPoolingConcurrency allocatorPoolingPolicy allowEphemeralPorts allowLoopback
    allowMultipleDirsUnderSameDiskPartition allowShadedLedgerManagerFactoryClass
    allowStorageExpansion auditorAcquireConcurrentOpenLedgerOperationsTimeOutMSec
    auditorLedgerVerificationPercentage auditorMaxNumberOfConcurrentOpenLedgerOperations
    auditorPeriodicBookieCheckInterval auditorPeriodicCheckInterval
    auditorPeriodicPlacementPolicyCheckInterval auditorReplicasCheckInterval
    authorizedRoles autoRecoveryDaemonEnabled batchReadEnabled
    bookieAddressResolverEnabled bookieAuthProviderFactoryClass
    bookieConnectionErrorQuarantineEnabled bookieDeathWatchInterval
    bookieErrorThresholdPerInterval bookieFailureHistoryExpirationMSec
    bookieHealthCheckEnabled bookieHealthCheckIntervalSeconds bookieId
    bookieMaxMultipleForWeightBasedPlacement bookiePort bookieQuarantineRatio
    bookieQuarantineTimeSeconds byteBufAllocatorSizeInitial byteBufAllocatorSizeMax
    byteBufAllocatorSizeMin clientAuthProviderFactoryClass
    clientConnectBookieUnavailableLogThrottling clientConnectTimeoutMillis
    clientKeyStore clientKeyStorePasswordPath clientKeyStoreType clientReceiveBufferSize
    clientRole clientSendBufferSize clientSockKeepalive clientTcpNoDelay
    clientTcpUserTimeoutMillis clientTrustStore clientTrustStorePasswordPath
    clientTrustStoreType clientWriteBufferHighWaterMark clientWriteBufferLowWaterMark
    closeChannelOnResponseTimeout codahaleStatsCSVEndpoint codahaleStatsGraphiteEndpoint
    codahaleStatsJmxEndpoint codahaleStatsOutputFrequencySeconds codahaleStatsPrefix
    codahaleStatsSlf4jEndpoint compactionMaxOutstandingRequests compactionRate
    compactionRateByBytes compactionRateByEntries dataIntegrityChecking
    dataIntegrityStampMissingCookies dbStorage_directIOEntryLoggerMaxFdCacheTimeSeconds
    dbStorage_directIOEntryLoggerReadBufferSizeMB
    dbStorage_directIOEntryLoggerTotalReadBufferSizeMB
    dbStorage_directIOEntryLoggerTotalWriteBufferSizeMB
    dbStorage_readAheadCacheBatchBytesSize dbStorage_readAheadCacheBatchSize
    dbStorage_readAheadCacheMaxSizeMb dbStorage_rocksDB_blockCacheSize
    dbStorage_rocksDB_blockSize dbStorage_rocksDB_bloomFilterBitsPerKey
    dbStorage_rocksDB_checksum_type dbStorage_rocksDB_format_version
    dbStorage_rocksDB_logPath dbStorage_rocksDB_maxSizeInLevel1MB
    dbStorage_rocksDB_numFilesInLevel0 dbStorage_rocksDB_numLevels
    dbStorage_rocksDB_sstSizeInMB dbStorage_rocksDB_writeBufferSizeMB
    dbStorage_writeCacheMaxSizeMb defaultRocksdbConf delayEnsembleChange
    desiredNumZonesPerWriteQuorum digestType disableEnsembleChangeFeatureName
    disableServerSocketBind diskCheckInterval diskUsageLwmThreshold diskUsageThreshold
    diskUsageWarnThreshold diskWeightBasedPlacementEnabled enableBookieAddressTracking
    enableBookieFailureTracking enableBusyWait enableDigestTypeAutodetection
    enableHealthCheck enableLocalTransport enableParallelRecoveryRead enableStatistics
    enableTaskExecutionStats enforceMinNumFaultDomainsForWrite
    enforceMinNumRacksPerWriteQuorum enforceStrictZoneawarePlacement
    ensemblePlacementPolicy entryFormatterClass entryLocationCompactionInterval
    entryLocationRocksdbConf entryLogFilePreallocationEnabled
    entryLogPerLedgerCounterLimitsMultFactor entryLogPerLedgerEnabled
    entrylogMapAccessExpiryTimeInSeconds explicitLacInterval exposeDefaultJVMMetrics
    extraServerComponents fileInfoCacheInitialCapacity fileInfoFormatVersionToWrite
    fileInfoMaxIdleTime firstSpeculativeReadLACTimeout firstSpeculativeReadTimeout
    flushEntrylogBytes flushInterval forceAllowCompaction forceReadOnlyBookie
    gcEntryLogMetadataCacheEnabled gcEntryLogMetadataCachePath gcMetadataOpRateLimit
    gcOverreplicatedLedgerMaxConcurrentRequests gcOverreplicatedLedgerWaitTime
    gcWaitTime getBookieInfoIntervalSeconds getBookieInfoRetryIntervalSeconds
    getBookieInfoTimeoutSecs httpServerClass httpServerEnabled httpServerHost
    httpServerKeyStorePassword httpServerKeyStorePath httpServerPort httpServerTlsEnable
    httpServerTrustStorePassword httpServerTrustStorePath
    ignoreExtraServerComponentsStartupFailures ignoreLocalNodeInPlacementPolicy
    inFlightReadEntryNumInLedgerChecker indexDirectories isForceGCAllowWhenNoSpace
    isThrottleByBytes journalAdaptiveGroupWrites journalAlignmentSize
    journalBufferedEntriesThreshold journalBufferedWritesThreshold
    journalChannelProvider journalDirectories journalDirectory
    journalFlushWhenQueueEmpty journalFormatVersionToWrite journalMaxBackups
    journalMaxGroupWaitMSec journalMaxMemorySizeMb journalMaxSizeMB
    journalPageCacheFlushIntervalMSec journalPreAllocSizeMB journalQueueSize
    journalRemoveFromPageCache journalReuseFiles journalSyncData
    journalWriteBufferSizeKB journalWriteData ledgerDirectories ledgerIdFormatterClass
    ledgerManagerFactoryClass ledgerManagerFactoryDisableClassCheck ledgerManagerType
    ledgerMetadataRocksdbConf ledgerMetadataVersion ledgerStorageClass limitStatsLogging
    listeningInterface localConsistencyCheckOnStartup localScrubInterval
    localScrubRateLimit lockReleaseOfFailedLedgerGracePeriod logSizeLimit
    lostBookieRecoveryDelay majorCompactionInterval majorCompactionMaxTimeMillis
    majorCompactionThreshold maxAddsInProgressLimit maxBatchReadSize
    maxNumEnsembleChanges maxOperationNumbersInSingleRocksdbWriteBatch
    maxPendingAddRequestsPerThread maxPendingReadRequestsPerThread
    maxReadsInProgressLimit maxSpeculativeReadLACTimeout maxSpeculativeReadTimeout
    maximumNumberOfActiveEntryLogs metadataServiceUri metastoreImplClass
    metastoreMaxEntriesPerScan minNumRacksPerWriteQuorum minNumZonesPerWriteQuorum
    minUsableSizeForEntryLogCreation minUsableSizeForHighPriorityWrites
    minUsableSizeForIndexFileCreation minorCompactionInterval
    minorCompactionMaxTimeMillis minorCompactionThreshold nettyMaxFrameSizeBytes
    nettyUsePooledBuffers networkTopologyScriptFileName networkTopologyScriptNumberArgs
    networkTopologyStabilizePeriodSeconds numAddWorkerThreads numChannelsPerBookie
    numHighPriorityWorkerThreads numIOThreads numJournalCallbackThreads
    numLongPollWorkerThreads numOfMemtableFlushThreads numReadWorkerThreads
    numWorkerThreads openFileLimit openLedgerRereplicationGracePeriod
    opportunisticStriping pageLimit pageSize passwd pcbcTimeoutTimerNumTicks
    pcbcTimeoutTimerTickDurationMs permittedStartupUsers persistBookieStatusEnabled
    preserveMdcForTaskExecution prometheusStatsHttpAddress prometheusStatsHttpPort
    prometheusStatsLatencyRolloverSeconds readBufferSizeBytes readEntryTimeoutSec
    readOnlyModeEnabled readOnlyModeOnAnyDiskFullEnabled
    readReorderThresholdPendingRequests readTimeout readWorkerThreadsThrottlingEnabled
    recoveryBatchReadEnabled recoveryReadBatchSize registrationClientClass
    registrationManagerClass reorderReadSequenceEnabled
    repairedPlacementPolicyNotAdheringBookieEnabled replicationRateByBytes
    reppDnsResolverClass requestTimerNumTicks requestTimerTickDurationMs
    rereplicationEntryBatchSize rwRereplicateBackoffMs sanityCheckMetricsEnabled
    serverNumAcceptorThreads serverNumIOThreads serverSockKeepalive serverTcpKeepCnt
    serverTcpKeepIdle serverTcpKeepIntvl serverTcpLinger serverTcpNoDelay
    serverWriteBufferHighWaterMark serverWriteBufferLowWaterMark
    shadedLedgerManagerFactoryClassPrefix skipListArenaChunkSize
    skipListArenaMaxAllocSize skipListSizeLimit skipReplayJournalInvalidRecord
    sortedLedgerStorageEnabled speculativeReadLACTimeoutBackoffMultiplier
    speculativeReadTimeout speculativeReadTimeoutBackoffMultiplier startTLSTimeoutSecs
    statsProviderClass stickyReadSEnabled storeSystemTimeAsLedgerCreationTime
    storeSystemTimeAsLedgerUnderreplicatedMarkTime taskExecutionWarnTimeMicros
    tcpKeepCnt tcpKeepIdle tcpKeepIntvl throttle timeoutMonitorIntervalSec
    timeoutTaskIntervalMillis timeoutTimerNumTicks timeoutTimerTickDurationMs
    tlsCertFilesRefreshDurationSeconds tlsCertificatePath tlsClientAuthentication
    tlsEnabledCipherSuites tlsEnabledProtocols tlsHostnameVerificationEnabled
    tlsKeyStore tlsKeyStorePasswordPath tlsKeyStoreType tlsProvider
    tlsProviderFactoryClass tlsTrustStore tlsTrustStorePasswordPath tlsTrustStoreType
    underreplicatedLedgerRecoveryGracePeriod useHostNameAsBookieID
    useHostnameResolveLocalNodePlacementPolicy useShortHostName
    useTargetEntryLogSizeForGc useTransactionalCompaction useV2WireProtocol
    verifyMetadataOnGC waitTimeoutOnBackpressureMs waitTimeoutOnResponseBackpressureMs
    writeBufferSizeBytes zkEnableSecurity zkLedgersRootPath zkReplicationTaskRateLimit
    zkRequestRateLimit zkRetryBackoffMaxMs zkRetryBackoffMaxRetries
    zkRetryBackoffStartMs zkServers zkTimeout
    """.split()) | {"journalDir", "ledgerDir", "localScrubPeriod"}


# The names only BookKeeper's ClientConfiguration has (not ServerConfiguration,
# AbstractConfiguration or bk_server.conf): in a bookie's file, a client's setting.
CLIENT_ONLY_NAMES = frozenset("""
    addEntryQuorumTimeoutSec addEntryTimeoutSec batchReadEnabled
    bookieConnectionErrorQuarantineEnabled bookieErrorThresholdPerInterval
    bookieFailureHistoryExpirationMSec bookieHealthCheckEnabled
    bookieHealthCheckIntervalSeconds bookieMaxMultipleForWeightBasedPlacement
    bookieQuarantineRatio bookieQuarantineTimeSeconds clientAuthProviderFactoryClass
    clientConnectBookieUnavailableLogThrottling clientConnectTimeoutMillis
    clientKeyStore clientKeyStorePasswordPath clientKeyStoreType clientReceiveBufferSize
    clientRole clientSendBufferSize clientSockKeepalive clientTcpNoDelay
    clientTcpUserTimeoutMillis clientTrustStore clientTrustStorePasswordPath
    clientTrustStoreType clientWriteBufferHighWaterMark clientWriteBufferLowWaterMark
    delayEnsembleChange disableEnsembleChangeFeatureName diskWeightBasedPlacementEnabled
    enableBookieAddressTracking enableBookieFailureTracking enableParallelRecoveryRead
    explicitLacInterval firstSpeculativeReadLACTimeout firstSpeculativeReadTimeout
    getBookieInfoIntervalSeconds getBookieInfoRetryIntervalSeconds
    getBookieInfoTimeoutSecs maxNumEnsembleChanges maxSpeculativeReadLACTimeout
    maxSpeculativeReadTimeout nettyUsePooledBuffers
    networkTopologyStabilizePeriodSeconds numChannelsPerBookie numIOThreads
    numWorkerThreads opportunisticStriping pcbcTimeoutTimerNumTicks
    pcbcTimeoutTimerTickDurationMs readEntryTimeoutSec
    readReorderThresholdPendingRequests readTimeout recoveryBatchReadEnabled
    recoveryReadBatchSize registrationClientClass
    speculativeReadLACTimeoutBackoffMultiplier speculativeReadTimeout
    speculativeReadTimeoutBackoffMultiplier startTLSTimeoutSecs
    taskExecutionWarnTimeMicros tcpKeepCnt tcpKeepIdle tcpKeepIntvl throttle
    timeoutMonitorIntervalSec timeoutTaskIntervalMillis timeoutTimerNumTicks
    timeoutTimerTickDurationMs tlsHostnameVerificationEnabled
    useHostnameResolveLocalNodePlacementPolicy useV2WireProtocol
    waitTimeoutOnBackpressureMs
    """.split())


def known_reason(name: str, table: Mapping[str, BkName]) -> str | None:
    """Why ``name`` is accepted and ignored, or None when it is mapped or unknown."""
    entry = table.get(name)
    if entry is not None:
        return entry.why or None
    if name.startswith(STREAM_PREFIXES):
        return "BookKeeper's stream storage (table service) is not part of ledgerd"
    if name in CLIENT_ONLY_NAMES and "bookiePort" in table:
        return ("a BookKeeper client setting, which a bookie has no use for (a ledgerd "
                "client reads the ones it maps: `ledgerd config --client`)")
    if name in BOOKKEEPER_NAMES:
        return ("a BookKeeper setting this process has no use for (docs/configuration.md "
                "lists what ledgerd reads)")
    return None
