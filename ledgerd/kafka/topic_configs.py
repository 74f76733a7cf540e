"""Topic configs: which Kafka topic configs the gateway honours, and the config APIs'
decisions (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreateTopics'
configs), without I/O.

A topic's configs are the values set on it (``TopicRecord.configs`` in ZooKeeper);
every other name the gateway knows takes its default. A name is accepted only if the
gateway does what it says:

- ``retention.ms``, ``retention.bytes``: the partition's leader drops whole ledgers
  (Kafka: segments) from the front of the log once they are older / while the log
  without them stays at least that large (``retention.py``);
- ``max.message.bytes``: a larger produced batch gets MESSAGE_TOO_LARGE (at most the
  gateway's ``max_batch_bytes``);
- ``message.timestamp.type``: ``LogAppendTime`` makes the gateway stamp each batch
  with the time it takes it;
- ``cleanup.policy``: ``delete`` (retention only), ``compact`` (the partition's leader
  compacts its closed ledgers: ``compaction.py``, ``cleaner.py``; keyless records are
  refused), or both (``compact,delete``: compaction and retention);
- ``delete.retention.ms``: on a compacted topic, a tombstone (a record with a null
  value) that is its key's latest stays this long past its timestamp, then the cleaner
  removes it;
- ``min.compaction.lag.ms``: a ledger is compacted only once its newest record is this
  old; ``min.cleanable.dirty.ratio``: a pass runs only once the part of the log not
  compacted yet is at least this share of the compactable part;
- ``compression.type``: ``producer`` stores batches as produced; ``uncompressed``,
  ``gzip``, ``snappy``, ``lz4`` or ``zstd`` makes the gateway recompress each produced
  batch with that codec before it appends it, as Kafka's broker does
  (``compression.py``);
- ``segment.bytes``, ``segment.ms``: a partition's ledger (Kafka: its active segment)
  rolls once it holds this many bytes, or before a batch that would take it past
  them (default: the gateway's ``log_roll_bytes``; at least 1 MiB), or at an append
  once its first record is this old (at least 1 ms, as Kafka; while the partition's
  list holds ``ledgerlog.AGE_ROLL_MAX_LEDGERS`` ledgers, rolls by age wait and rolls
  by size go on) (``ledgerlog.LogWriter``'s ``roll_bytes`` / ``roll_interval``, set
  from the topic's policy before each append); only closed ledgers are dropped by
  retention or compacted;
- ``file.delete.delay.ms``: a ledger dropped from a partition's list (by retention,
  DeleteRecords or compaction) is deleted from the bookies this long after, the
  delay kept in the log's record (``Logs.reap``);
- ``max.compaction.lag.ms``: on a compacted topic, the ledger rolls once its first
  record is this old too (Kafka's ``LogConfig.maxSegmentMs``: the lower of it and
  ``segment.ms``), so a record becomes compactable within about this long plus the
  cleaner's ``compaction_backoff_ms``;
- ``min.insync.replicas``: a produce with ``acks=all`` gets NOT_ENOUGH_REPLICAS, and
  nothing is written, when the gateway's ledgers acknowledge an entry on fewer bookies
  than this (its ``ack_quorum_size``): an acknowledged batch is on at least this many
  journals, the copies Kafka's ISR stands for;
- ``message.format.version``, ``flush.ms``, ``flush.messages``,
  ``unclean.leader.election.enable``: accepted because they hold trivially (every
  batch is stored as RecordBatch v2, as Kafka 3+ does whatever the setting; every
  acknowledged batch is already on its ack quorum's journals; a new writer recovers
  the ledger before it appends, so no election can drop an acknowledged batch, which
  ``true`` would only permit).

Anything else is refused, never kept silently: an unknown name, or a value outside
what the config allows, with INVALID_CONFIG and a message naming the config.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledgerd.base.errors import LedgerdError
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.compression import Codec

__all__ = ["CONFIG_SPECS", "ConfigRefusedError", "ConfigSource", "ConfigSpec", "OpType",
           "ResourceType", "TopicPolicy", "altered", "checked", "config_entry",
           "incrementally_altered", "list_applied", "operation", "topic_entries"]

LONG_MAX = 2**63 - 1
# the lowest segment.ms / max.compaction.lag.ms, as Kafka's; a partition's ledgers are
# one list in one ZooKeeper record (about 100,000 fit), so rolls by age stop while the
# list holds ``ledgerlog.AGE_ROLL_MAX_LEDGERS`` (rolls by size go on)
MIN_ROLL_MS = 1
INT_MAX = 2**31 - 1


class ResourceType(enum.IntEnum):
    """Kafka's ConfigResource types."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    GROUP = 32


class ConfigSource(enum.IntEnum):
    """DescribeConfigs' ConfigSource (v1+)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class OpType(enum.IntEnum):
    """IncrementalAlterConfigs' ConfigOperation."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class ConfigType(enum.IntEnum):
    """DescribeConfigs' ConfigType (v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class ConfigRefusedError(LedgerdError):
    """A config change refused: ``code`` (INVALID_CONFIG, POLICY_VIOLATION,
    INVALID_REQUEST) and a one-line message naming the config."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


def _integer(low: int, high: int) -> Callable[[str, str], str]:
    def check(name: str, value: str) -> str:
        try:
            n = int(value.strip())
        except ValueError:
            raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                     f"{name}={value!r}: not an integer") from None
        if not low <= n <= high:
            raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                     f"{name}={n}: allowed {low} to {high}")
        return str(n)
    return check


def _one_of(*allowed: str) -> Callable[[str, str], str]:
    def check(name: str, value: str) -> str:
        v = value.strip()
        if v in allowed:
            return v
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"{name}={value!r}: allowed {', '.join(allowed)}")
    return check


def _boolean(name: str, value: str) -> str:
    v = value.strip().lower()  # Kafka's ConfigDef reads booleans case-insensitively
    if v in ("true", "false"):
        return v
    raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                             f"{name}={value!r}: allowed true or false")


def _cleanup_policy(name: str, value: str) -> str:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or len(set(items)) != len(items) or \
            not set(items) <= {"compact", "delete"}:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"{name}={value!r}: allowed 'delete', 'compact' or "
                                 "'compact,delete'")
    return ",".join(items)


def _ratio(name: str, value: str) -> str:
    try:
        r = float(value.strip())
    except ValueError:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"{name}={value!r}: not a number") from None
    if not 0.0 <= r <= 1.0:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"{name}={r}: allowed 0 to 1")
    return str(r)


def _format_version(name: str, value: str) -> str:
    v = value.strip()
    parts = v.split("-", 1)[0].split(".")
    if not v or not all(p.isdigit() for p in parts):
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"{name}={value!r}: not a Kafka version (such as 3.0)")
    return v


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    """One topic config the gateway knows: its default (None: the gateway's setting
    ``default_from``), type, check (returns the normalised value or raises
    ConfigRefusedError) and documentation."""

    name: str
    default: str | None
    kind: ConfigType
    check: Callable[[str, str], str]
    doc: str
    default_from: str = ""


CONFIG_SPECS: dict[str, ConfigSpec] = {s.name: s for s in (
    ConfigSpec("cleanup.policy", "delete", ConfigType.LIST, _cleanup_policy,
               "'delete': old ledgers are dropped by retention; 'compact': the leader's "
               "cleaner keeps at least the latest record of each key in closed ledgers "
               "(offsets unchanged; keyless records are refused); 'compact,delete': both."),
    ConfigSpec("compression.type", "producer", ConfigType.STRING,
               _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
               "'producer' keeps the producer's codec; any other value makes the gateway "
               "recompress each produced batch with that codec."),
    ConfigSpec("delete.retention.ms", "86400000", ConfigType.LONG, _integer(0, LONG_MAX),
               "On a compacted topic: how long a tombstone (null value) that is its key's "
               "latest is kept past its timestamp before the cleaner removes it."),
    ConfigSpec("file.delete.delay.ms", "60000", ConfigType.LONG, _integer(0, LONG_MAX),
               "A ledger dropped from a partition's list (retention, DeleteRecords, "
               "compaction) is deleted from the bookies this long after; until then a "
               "reader that still holds it reads on."),
    ConfigSpec("flush.messages", str(LONG_MAX), ConfigType.LONG, _integer(1, LONG_MAX),
               "Accepted; every acknowledged batch is already on its ack quorum's "
               "journals."),
    ConfigSpec("flush.ms", str(LONG_MAX), ConfigType.LONG, _integer(0, LONG_MAX),
               "Accepted; every acknowledged batch is already on its ack quorum's "
               "journals."),
    ConfigSpec("max.message.bytes", None, ConfigType.INT, _integer(0, INT_MAX),
               "Largest record batch accepted (MESSAGE_TOO_LARGE above it); at most the "
               "gateway's max_batch_bytes.", default_from="max_batch_bytes"),
    ConfigSpec("max.compaction.lag.ms", str(LONG_MAX), ConfigType.LONG,
               _integer(MIN_ROLL_MS, LONG_MAX),
               "On a compacted topic, a partition's ledger rolls once its first record is "
               "this old (as with segment.ms), so its records become compactable."),
    ConfigSpec("min.cleanable.dirty.ratio", "0.5", ConfigType.DOUBLE, _ratio,
               "A compaction pass runs once the share of the compactable ledgers' bytes "
               "not compacted yet is at least this."),
    ConfigSpec("min.compaction.lag.ms", "0", ConfigType.LONG, _integer(0, LONG_MAX),
               "A closed ledger is compacted only once its newest record is this old."),
    ConfigSpec("min.insync.replicas", "1", ConfigType.INT, _integer(1, INT_MAX),
               "A produce with acks=all is refused (NOT_ENOUGH_REPLICAS) when the "
               "gateway's ledgers acknowledge on fewer bookies than this (its "
               "ack_quorum_size)."),
    ConfigSpec("unclean.leader.election.enable", "false", ConfigType.BOOLEAN, _boolean,
               "Accepted; a new writer recovers the partition's ledger before it appends, "
               "so no acknowledged batch is ever dropped, whatever this permits."),
    ConfigSpec("message.format.version", "3.0-IV1", ConfigType.STRING, _format_version,
               "Accepted and without effect, as on Kafka 3+: batches are stored as "
               "RecordBatch v2."),
    ConfigSpec("message.timestamp.type", "CreateTime", ConfigType.STRING,
               _one_of("CreateTime", "LogAppendTime"),
               "CreateTime keeps the producer's timestamps; LogAppendTime stamps each "
               "batch with the gateway's clock when it takes it."),
    ConfigSpec("retention.bytes", "-1", ConfigType.LONG, _integer(-1, LONG_MAX),
               "Oldest ledgers are dropped while the partition stays at least this large "
               "without them (-1 = no limit)."),
    ConfigSpec("segment.bytes", "1073741824", ConfigType.INT, _integer(1 << 20, INT_MAX),
               "A partition's ledger rolls once it holds this many bytes (default: the "
               "gateway's log_roll_bytes); retention and compaction take closed ledgers "
               "only. At least 1 MiB (as Kafka 4.1+, and the gateway's log_roll_bytes)."),
    ConfigSpec("segment.ms", "604800000", ConfigType.LONG, _integer(MIN_ROLL_MS, LONG_MAX),
               "A partition's ledger rolls, at an append, once its first record is this "
               "old. While the partition's list holds 10,000 ledgers (it is one ZooKeeper "
               "record, which a compacted topic never shortens) rolls by age wait; rolls "
               "by size go on."),
    ConfigSpec("retention.ms", "-1", ConfigType.LONG, _integer(-1, LONG_MAX),
               "Ledgers whose newest record is older than this are dropped (-1 = keep "
               "forever, the gateway's default: Kafka's is 7 days)."),
)}


def checked(name: str, value: str | None, *, max_batch_bytes: int) -> str:
    """``value`` normalised for config ``name``; raises ConfigRefusedError naming it
    (unknown name, null value, a value out of range or not honoured)."""
    spec = CONFIG_SPECS.get(name)
    if spec is None:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"unknown topic config {name!r} (the gateway honours: "
                                 f"{', '.join(sorted(CONFIG_SPECS))})")
    if value is None:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG, f"{name}: null value")
    out = spec.check(name, value)
    if name == "max.message.bytes" and int(out) > max_batch_bytes:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"max.message.bytes={out}: over the gateway's limit "
                                 f"{max_batch_bytes} (max_batch_bytes)")
    return out


def altered(pairs: Sequence[tuple[str, str | None]], *, max_batch_bytes: int,
            last_wins: bool = False) -> dict[str, str]:
    """AlterConfigs (and CreateTopics' configs): the request's configs replace the
    topic's whole set; a config set to its default is kept as set, as Kafka does.
    Unknown names are reported before unhonoured values. A name given twice is
    refused (INVALID_REQUEST), or with ``last_wins`` (AlterConfigs, as Kafka before
    3.2 and librdkafka's test suite with it) takes its last value, each value checked."""
    for name, value in pairs:
        if name not in CONFIG_SPECS:
            checked(name, value, max_batch_bytes=max_batch_bytes)  # raises: unknown
    out: dict[str, str] = {}
    for name, value in pairs:
        if name in out and not last_wins:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                     f"config {name!r} given twice")
        out[name] = checked(name, value, max_batch_bytes=max_batch_bytes)
    return out


def incrementally_altered(current: Mapping[str, str],
                          ops: Sequence[tuple[str, int, str | None]], *,
                          max_batch_bytes: int) -> dict[str, str]:
    """IncrementalAlterConfigs: ``current`` with each (name, op, value) applied; SET and
    DELETE on any config, APPEND and SUBTRACT on list configs (``cleanup.policy``)."""
    seen: set[str] = set()
    out = dict(current)
    for name, op, value in ops:
        if name in seen:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                     f"config {name!r} given twice")
        seen.add(name)
        spec = CONFIG_SPECS.get(name)
        if spec is None:
            checked(name, value, max_batch_bytes=max_batch_bytes)  # raises: unknown
            raise AssertionError("unreachable")
        kind = operation(name, op)
        if kind is OpType.DELETE:
            out.pop(name, None)
            continue
        if kind is OpType.SET:
            out[name] = checked(name, value, max_batch_bytes=max_batch_bytes)
            continue
        if spec.kind is not ConfigType.LIST:
            raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                     f"{name}: {kind.name} applies to list configs only")
        items = list_applied(kind, out.get(name, spec.default or ""), value)
        if not items:
            out.pop(name, None)  # an emptied list falls back to the default
        else:
            out[name] = checked(name, ",".join(items), max_batch_bytes=max_batch_bytes)
    return out


def operation(name: str, op: int) -> OpType:
    """IncrementalAlterConfigs' operation ``op`` on config ``name``, or a refusal."""
    try:
        return OpType(op)
    except ValueError:
        raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                 f"{name}: unknown operation {op}") from None


def list_applied(kind: OpType, current: str, value: str | None) -> list[str]:
    """APPEND / SUBTRACT of ``value``'s comma-separated items to / from ``current``."""
    items = [v for v in current.split(",") if v]
    given = [v.strip() for v in (value or "").split(",") if v.strip()]
    if kind is OpType.APPEND:
        return items + [v for v in given if v not in items]
    return [v for v in items if v not in given]


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """What the gateway enforces for a topic, from its configs."""

    retention_ms: int = -1
    retention_bytes: int = -1
    max_message_bytes: int = 1 << 20
    log_append_time: bool = False
    compression: Codec | None = None  # None: the producer's
    compact: bool = False  # cleanup.policy holds 'compact'
    delete: bool = True  # cleanup.policy holds 'delete' (retention applies)
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    segment_bytes: int | None = None  # None: the gateway's log_roll_bytes
    segment_ms: int = 604_800_000
    max_compaction_lag_ms: int = LONG_MAX
    min_insync_replicas: int = 1
    file_delete_delay_ms: int = 60_000

    @classmethod
    def of(cls, configs: Mapping[str, str], *, max_batch_bytes: int) -> TopicPolicy:
        policy = configs.get("cleanup.policy", "delete").split(",")
        return cls(compact="compact" in policy, delete="delete" in policy,
                   delete_retention_ms=int(configs.get("delete.retention.ms", "86400000")),
                   min_compaction_lag_ms=int(configs.get("min.compaction.lag.ms", "0")),
                   min_cleanable_dirty_ratio=float(
                       configs.get("min.cleanable.dirty.ratio", "0.5")),
                   retention_ms=int(configs.get("retention.ms", "-1")),
                   retention_bytes=int(configs.get("retention.bytes", "-1")),
                   max_message_bytes=min(int(configs.get("max.message.bytes",
                                                         max_batch_bytes)), max_batch_bytes),
                   log_append_time=configs.get("message.timestamp.type") == "LogAppendTime",
                   compression=Codec.of_config(configs.get("compression.type", "producer")),
                   segment_bytes=int(configs["segment.bytes"]) if "segment.bytes" in configs
                   else None,
                   segment_ms=int(configs.get("segment.ms", "604800000")),
                   max_compaction_lag_ms=int(configs.get("max.compaction.lag.ms",
                                                         str(LONG_MAX))),
                   min_insync_replicas=int(configs.get("min.insync.replicas", "1")),
                   file_delete_delay_ms=int(configs.get("file.delete.delay.ms", "60000")))

    def rolling(self, default_bytes: int) -> tuple[int, float]:
        """(bytes, seconds) at which a partition's ledger rolls: segment.bytes (else
        ``default_bytes``), and segment.ms, or on a compacted topic the lower of it and
        max.compaction.lag.ms (Kafka's ``LogConfig.maxSegmentMs``)."""
        ms = min(self.segment_ms, self.max_compaction_lag_ms) if self.compact \
            else self.segment_ms
        return (default_bytes if self.segment_bytes is None else self.segment_bytes,
                ms / 1000)

    @property
    def has_retention(self) -> bool:
        """Retention applies: the policy holds 'delete' and a limit is set."""
        return self.delete and (self.retention_ms >= 0 or self.retention_bytes >= 0)


def config_entry(version: int, name: str, value: str | None, *, read_only: bool,
                 source: int, kind: ConfigType, doc: str, include_synonyms: bool,
                 include_docs: bool, synonyms: Sequence[tuple[str, str | None, int]] = (),
                 ) -> dict[str, Any]:
    """One DescribeConfigs entry; ``synonyms`` (name, value, source) in the order they
    take precedence, the entry's own first (only itself if none are given)."""
    entry: dict[str, Any] = {
        "name": name, "value": value, "read_only": read_only,
        "is_default": source == ConfigSource.DEFAULT_CONFIG, "config_source": source,
        "is_sensitive": False, "synonyms": [], "config_type": kind,
        "documentation": doc if include_docs else None}
    if include_synonyms and version >= 1:
        entry["synonyms"] = [{"name": n, "value": v, "source": src}
                             for n, v, src in (synonyms or [(name, value, source)])]
    return entry


def topic_entries(version: int, configs: Mapping[str, str], keys: Sequence[str] | None, *,
                  max_batch_bytes: int, include_synonyms: bool = False,
                  include_docs: bool = False,
                  broker_defaults: Mapping[str, Sequence[tuple[str, str, int]]] | None = None,
                  static_defaults: Mapping[str, str] | None = None,
                  ) -> list[dict[str, Any]]:
    """DescribeConfigs' entries for a topic: every config the gateway knows (or those
    of ``keys`` it knows), set ones as DYNAMIC_TOPIC_CONFIG, then those a dynamic
    broker config sets (``broker_defaults``: name -> its broker synonyms as (name,
    value, source), ``broker_configs.topic_defaults``), the rest as defaults: the
    gateway's own where its settings give one (``static_defaults``, e.g. the ledger
    roll size for ``segment.bytes``), else the spec's."""
    out = []
    broker_defaults = broker_defaults or {}
    static_defaults = static_defaults or {}
    for name in sorted(CONFIG_SPECS) if keys is None else keys:
        spec = CONFIG_SPECS.get(name)
        if spec is None:
            continue  # Kafka leaves out names it does not know
        levels: list[tuple[str, str, int]] = []
        if name in configs:
            levels.append((name, configs[name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
        levels += broker_defaults.get(name, ())
        default = static_defaults.get(name, spec.default)
        levels.append((name, default if default is not None else str(max_batch_bytes),
                       ConfigSource.DEFAULT_CONFIG))
        _, value, source = levels[0]
        out.append(config_entry(version, name, value, read_only=False, source=source,
                                kind=spec.kind, doc=spec.doc, synonyms=levels,
                                include_synonyms=include_synonyms,
                                include_docs=include_docs))
    return out
