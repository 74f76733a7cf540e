"""Dynamic broker configs (KIP-226): which a client may change, and what they do.

A Kafka broker's configs come from its properties file, and some of them may be
changed at run time with AlterConfigs / IncrementalAlterConfigs on resource BROKER:
for one broker (name ``"<id>"``) or for all (name ``""``, the cluster-wide default).
The gateway's static settings are its configuration file (read-only, as Kafka's
non-dynamic configs); the names below are the dynamic ones, kept in ZooKeeper
(``metadata.kafka_broker_configs``) and read by every gateway within ``TTL_S``.
A broker's own value wins over the default, the default over the file.

What each name does here, as on a Kafka broker:

- the *topic defaults* (``log.retention.ms``, ``log.retention.bytes``,
  ``message.max.bytes``, ``log.message.timestamp.type``, ``compression.type``,
  ``log.cleanup.policy``, ``log.cleaner.delete.retention.ms``,
  ``log.cleaner.min.compaction.lag.ms``, ``log.cleaner.max.compaction.lag.ms``,
  ``log.cleaner.min.cleanable.ratio``, ``log.segment.bytes``, ``log.roll.ms``,
  ``log.segment.delete.delay.ms``, ``log.flush.interval.ms``, ``log.flush.interval.messages``): the value every topic
  without its own (topic config) takes, on the partitions the gateway leads. Each is
  checked as its topic config is (``topic_configs``), so a value a topic may not
  have (a policy the gateway cannot honour) is refused here too;
- ``background.threads``: accepted; the gateway's background work (retention, the
  transaction sweep, group ticks) runs as tasks of its event loop, so there is no
  pool of threads to size;
- ``sasl.kerberos.min.time.before.relogin``: accepted; the gateway serves no GSSAPI
  (Kerberos) mechanism and so never logs in to Kerberos, as a Kafka broker without a
  GSSAPI listener.

Any other name is refused: a static setting (INVALID_REQUEST, "cannot be changed at
run time", as Kafka answers for its non-dynamic configs) or an unknown one
(INVALID_CONFIG). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.topic_configs import (
    CONFIG_SPECS,
    INT_MAX,
    LONG_MAX,
    ConfigRefusedError,
    ConfigSource,
    ConfigType,
    OpType,
    _integer,
    checked,
    config_entry,
    list_applied,
    operation,
)

__all__ = ["BROKER_SPECS", "BrokerSpec", "broker_altered", "broker_entries",
           "broker_incrementally_altered", "effective_topic_configs", "topic_defaults"]

OWN = ConfigSource.DYNAMIC_BROKER_CONFIG
DEFAULT = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """A dynamic broker config: the topic config it is the default of (``topic``), or
    its own type, check and default value."""

    name: str
    topic: str = ""
    kind: ConfigType = ConfigType.STRING
    check: Callable[[str, str], str] | None = None
    default: str = ""
    doc: str = ""


_TOPIC_DEFAULTS = {
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "compression.type": "compression.type",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.flush.interval.ms": "flush.ms",
    "log.flush.interval.messages": "flush.messages",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

BROKER_SPECS: dict[str, BrokerSpec] = {
    **{name: BrokerSpec(name, topic=topic) for name, topic in _TOPIC_DEFAULTS.items()
       if topic in CONFIG_SPECS},
    "background.threads": BrokerSpec(
        "background.threads", kind=ConfigType.INT, check=_integer(1, INT_MAX), default="10",
        doc="Accepted; the gateway's background work runs as tasks of its event loop, "
            "not on a pool of threads."),
    "sasl.kerberos.min.time.before.relogin": BrokerSpec(
        "sasl.kerberos.min.time.before.relogin", kind=ConfigType.LONG,
        check=_integer(0, LONG_MAX), default="60000",
        doc="Accepted; the gateway serves no GSSAPI (Kerberos) mechanism, so it never "
            "logs in to Kerberos."),
}


def _kind(spec: BrokerSpec) -> ConfigType:
    return CONFIG_SPECS[spec.topic].kind if spec.topic else spec.kind


def _check(name: str, value: str | None, static: Mapping[str, str], *,
           max_batch_bytes: int) -> str:
    spec = BROKER_SPECS.get(name)
    if spec is None:
        if name in static:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                     f"{name}: a static broker config, it cannot be changed "
                                     "at run time (the gateway's configuration file)")
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                 f"unknown broker config {name!r} (dynamic ones here: "
                                 f"{', '.join(sorted(BROKER_SPECS))})")
    if value is None:
        raise ConfigRefusedError(ErrorCode.INVALID_CONFIG, f"{name}: null value")
    if spec.topic:
        try:
            return checked(spec.topic, value, max_batch_bytes=max_batch_bytes)
        except ConfigRefusedError as exc:
            raise ConfigRefusedError(exc.code, f"{name} (the default of topic config "
                                               f"{spec.topic}): {exc.message}") from None
    assert spec.check is not None
    return spec.check(name, value)


def broker_altered(pairs: Sequence[tuple[str, str | None]], static: Mapping[str, str], *,
                   max_batch_bytes: int) -> dict[str, str]:
    """AlterConfigs on a broker: the request's configs replace the broker's (or the
    default's) whole dynamic set, as Kafka's does; a name given twice takes its last
    value (as AlterConfigs does for topics here)."""
    out: dict[str, str] = {}
    for name, value in pairs:
        out[name] = _check(name, value, static, max_batch_bytes=max_batch_bytes)
    return out


def broker_incrementally_altered(current: Mapping[str, str],
                                 ops: Sequence[tuple[str, int, str | None]],
                                 static: Mapping[str, str], *,
                                 max_batch_bytes: int) -> dict[str, str]:
    """IncrementalAlterConfigs on a broker: SET and DELETE on any dynamic config,
    APPEND and SUBTRACT on list ones (``log.cleanup.policy``)."""
    out = dict(current)
    seen: set[str] = set()
    for name, op, value in ops:
        if name in seen:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST, f"config {name!r} given twice")
        seen.add(name)
        kind = operation(name, op)
        if kind is OpType.DELETE:
            if name not in BROKER_SPECS:
                _check(name, value, static, max_batch_bytes=max_batch_bytes)  # raises
            out.pop(name, None)
            continue
        if kind is OpType.SET:
            out[name] = _check(name, value, static, max_batch_bytes=max_batch_bytes)
            continue
        spec = BROKER_SPECS.get(name)
        if spec is None:
            _check(name, value, static, max_batch_bytes=max_batch_bytes)  # raises
            raise AssertionError("unreachable")
        if _kind(spec) is not ConfigType.LIST:
            raise ConfigRefusedError(ErrorCode.INVALID_CONFIG,
                                     f"{name}: {kind.name} applies to list configs only")
        items = list_applied(kind, out.get(name, static.get(name, "")), value)
        if not items:
            out.pop(name, None)  # an emptied list falls back to the file's value
        else:
            out[name] = _check(name, ",".join(items), static,
                               max_batch_bytes=max_batch_bytes)
    return out


def topic_defaults(default: Mapping[str, str], own: Mapping[str, str],
                   ) -> dict[str, list[tuple[str, str, int]]]:
    """Topic config name -> the dynamic broker configs that set its default, as
    (broker config name, value, ConfigSource), this broker's own before the
    cluster-wide default: the first is the value a topic without its own takes."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    for level, source in ((own, OWN), (default, DEFAULT)):
        for name, value in sorted(level.items()):
            spec = BROKER_SPECS.get(name)
            if spec is not None and spec.topic:
                out.setdefault(spec.topic, []).append((name, value, source))
    return out


def effective_topic_configs(configs: Mapping[str, str], default: Mapping[str, str],
                            own: Mapping[str, str]) -> dict[str, str]:
    """A topic's configs as the gateway enforces them: its own, else the dynamic
    broker configs' defaults."""
    out = {topic: levels[0][1] for topic, levels in topic_defaults(default, own).items()}
    out.update(configs)
    return out


def _default_value(spec: BrokerSpec) -> str:
    if spec.topic:
        return CONFIG_SPECS[spec.topic].default or ""
    return spec.default


def broker_entries(version: int, static: Mapping[str, str], default: Mapping[str, str],
                   own: Mapping[str, str] | None, keys: Sequence[str] | None, *,
                   include_synonyms: bool = False, include_docs: bool = False,
                   ) -> list[dict[str, Any]]:
    """DescribeConfigs' entries for a broker: ``own`` is its dynamic values (None: the
    cluster-wide default resource, name ``""``, which lists only the dynamic defaults
    set, as Kafka does). A dynamic config shows where its value comes from (the
    broker's own, the default, the file, or Kafka's default) and is not read-only;
    the static settings are read-only."""
    if own is None:
        names = sorted(default) if keys is None else [k for k in keys if k in default]
        return [config_entry(version, name, default[name], read_only=False, source=DEFAULT,
                             kind=_kind(BROKER_SPECS[name]) if name in BROKER_SPECS
                             else ConfigType.STRING, doc=_doc(name),
                             include_synonyms=include_synonyms, include_docs=include_docs)
                for name in names]
    out = []
    for name in sorted(set(static) | set(BROKER_SPECS)) if keys is None else keys:
        spec = BROKER_SPECS.get(name)
        levels: list[tuple[str, str, int]] = []
        if name in own:
            levels.append((name, own[name], OWN))
        if name in default:
            levels.append((name, default[name], DEFAULT))
        if name in static:
            levels.append((name, static[name], ConfigSource.STATIC_BROKER_CONFIG))
        elif spec is not None:
            levels.append((name, _default_value(spec), ConfigSource.DEFAULT_CONFIG))
        if not levels:
            continue  # Kafka leaves out names it does not know
        _, value, source = levels[0]
        if spec is not None:
            kind = _kind(spec)
        else:
            kind = ConfigType.LONG if value.lstrip("-").isdigit() else (
                ConfigType.BOOLEAN if value in ("true", "false") else ConfigType.STRING)
        out.append(config_entry(version, name, value, read_only=spec is None, source=source,
                                kind=kind, doc=_doc(name), synonyms=levels,
                                include_synonyms=include_synonyms,
                                include_docs=include_docs))
    return out


def _doc(name: str) -> str:
    spec = BROKER_SPECS.get(name)
    if spec is None:
        return "the gateway's setting (read-only: its configuration file)"
    if spec.topic:
        return (f"The default of topic config {spec.topic} for topics without their own: "
                f"{CONFIG_SPECS[spec.topic].doc}")
    return spec.doc
