"""Kafka dynamic broker configs: ``<root>/kafka/broker_configs``, one record.

Kafka lets an admin change some broker configs at run time (KIP-226): for one broker
(AlterConfigs / IncrementalAlterConfigs on resource BROKER, name ``"<id>"``) or as the
cluster-wide default (name ``""``). The gateways keep the same two levels in one
record, so that every gateway reads all of it at once (one read per ``TTL``) and a
change is one compare-and-set::

    {"format": 1, "default": {name: value}, "brokers": {"<id>": {name: value}}}

Which names may be set, and what each does, is the gateway's decision
(``ledgerd/kafka/broker_configs.py``); values are stored as validated there. A broker's
own value wins over the default, the default over the gateway's configuration file.

Pure record types and a thin store; no trio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import ChangeRejectedError, NodeExistsError, NoNodeError
from ledgerd.metadata.jsondoc import STR_MAP, Codec, decode, encode, json_field
from ledgerd.metadata.paths import kafka_broker_configs_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["BrokerConfigRecord", "BrokerConfigStore"]


def _brokers(value: object) -> Mapping[int, Mapping[str, str]]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of brokers, got {value!r}")
    out: dict[int, Mapping[str, str]] = {}
    for key, configs in value.items():
        if not isinstance(key, str) or not key.isdigit():
            raise ValueError(f"broker {key!r}: not a broker id")
        out[int(key)] = STR_MAP.load(configs)
    return out


BROKERS: Codec[Mapping[int, Mapping[str, str]]] = Codec(
    lambda m: {str(k): dict(sorted(v.items())) for k, v in sorted(m.items()) if v},
    _brokers)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfigRecord:
    """The cluster-wide defaults and each broker's own values."""

    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = None

    default: Mapping[str, str] = json_field("default", STR_MAP, default_factory=dict)
    brokers: Mapping[int, Mapping[str, str]] = json_field("brokers", BROKERS,
                                                          default_factory=dict)

    def of(self, broker: int | None) -> Mapping[str, str]:
        """The values set for ``broker`` (None: the cluster-wide default)."""
        return self.default if broker is None else self.brokers.get(broker, {})

    def with_values(self, broker: int | None, values: Mapping[str, str],
                    ) -> BrokerConfigRecord:
        """This record with ``broker``'s (None: the default's) values replaced."""
        if broker is None:
            return replace(self, default=dict(values))
        brokers = {**self.brokers, broker: dict(values)}
        return replace(self, brokers={k: v for k, v in brokers.items() if v})


def _decode(raw: bytes, path: str) -> BrokerConfigRecord:
    return decode(BrokerConfigRecord, raw, path)


def _encode(record: BrokerConfigRecord) -> bytes:
    return encode(record)


class BrokerConfigStore:
    """The dynamic broker configs under ``kafka_root``."""

    MAX_BYTES = 256 << 10  # far below ZooKeeper's 1 MiB; a few hundred brokers' worth

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.path = kafka_broker_configs_path(kafka_root)

    async def get(self) -> tuple[BrokerConfigRecord, int]:
        """The record and its znode version (an empty one, -1, if none was written)."""
        try:
            raw, stat = await self.store.get(self.path)
        except NoNodeError:
            return BrokerConfigRecord(), -1
        return _decode(raw, self.path), stat.version

    async def update(self, broker: int | None,
                     change: Callable[[Mapping[str, str]], Mapping[str, str]],
                     ) -> tuple[BrokerConfigRecord, int]:
        """Replace ``broker``'s (None: the default's) values with ``change(values)``,
        under compare-and-set; returns the record after and its znode version. ``change`` may raise
        ChangeRejectedError (nothing is written). If cancelled, the change may or may
        not have been written."""

        def apply(current: BrokerConfigRecord) -> BrokerConfigRecord:
            old = current.of(broker)
            new = change(old)
            if dict(new) == dict(old):
                return current
            out = current.with_values(broker, new)
            if len(_encode(out)) > self.MAX_BYTES:
                raise ChangeRejectedError(f"{self.path}: the dynamic broker configs would "
                                          f"pass {self.MAX_BYTES} bytes")
            return out

        try:
            await self.store.create(self.path, _encode(BrokerConfigRecord()),
                                    make_parents=True)
        except NodeExistsError:
            pass
        return await cas_update(self.store, self.path, apply, decode=_decode,
                                encode=_encode)
