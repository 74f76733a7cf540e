"""A group's configs (ConfigResource type GROUP): KIP-932's share group configs, and
KIP-848's consumer group ones, which Kafka 4 takes for any group id.

The ``consumer.*`` ones are kept and described as Kafka 4 keeps them; they apply to
KIP-848 (consumer protocol) groups, which the gateway does not serve, and a classic
group's members give their own timeouts, as on Kafka, so they change nothing here.

Set with IncrementalAlterConfigs (SET / DELETE), read with DescribeConfigs, stored by
``metadata.kafka_share``. Pure: names, defaults, validation and what a share
partition takes from them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ledgerd.errors import LedgerdError
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.share_partition import ShareSettings

__all__ = ["DEFAULTS", "ShareConfigError", "altered", "duration_ms", "entries",
           "read_committed", "reset_policy", "settings", "value"]

DEFAULTS = {
    "share.auto.offset.reset": "latest",
    "share.isolation.level": "read_uncommitted",
    "share.record.lock.duration.ms": "30000",
    "share.delivery.count.limit": "5",
    "share.session.timeout.ms": "45000",
    "share.heartbeat.interval.ms": "5000",
    "consumer.session.timeout.ms": "45000",
    "consumer.heartbeat.interval.ms": "5000",
}
_DURATION = re.compile(r"^by_duration:P(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?$")
_RANGES = {
    "share.record.lock.duration.ms": (1000, 3_600_000),
    "share.delivery.count.limit": (2, 10),
    "share.session.timeout.ms": (1000, 3_600_000),
    "share.heartbeat.interval.ms": (100, 3_600_000),
    # Kafka's group.consumer.{min,max}.session.timeout.ms and
    # group.consumer.{min,max}.heartbeat.interval.ms defaults
    "consumer.session.timeout.ms": (45_000, 60_000),
    "consumer.heartbeat.interval.ms": (5_000, 15_000),
}
SET, DELETE = 0, 1


class ShareConfigError(LedgerdError, ValueError):
    """A share group config name, value or operation refused (its Kafka error code
    and a message naming it)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _check(name: str, value: str) -> None:
    if name not in DEFAULTS:
        raise ShareConfigError(ErrorCode.INVALID_CONFIG,
                               f"{name!r} is not a group config; these are: "
                               f"{', '.join(sorted(DEFAULTS))}")
    if name == "share.auto.offset.reset":
        if value not in ("earliest", "latest") and not _DURATION.match(value):
            raise ShareConfigError(ErrorCode.INVALID_CONFIG,
                                   f"share.auto.offset.reset={value!r}: earliest, latest "
                                   "or by_duration:<ISO-8601 duration>")
    elif name == "share.isolation.level":
        if value not in ("read_committed", "read_uncommitted"):
            raise ShareConfigError(ErrorCode.INVALID_CONFIG,
                                   f"share.isolation.level={value!r}: read_committed or "
                                   "read_uncommitted")
    else:
        lo, hi = _RANGES[name]
        if not value.isdigit() or not lo <= int(value) <= hi:
            raise ShareConfigError(ErrorCode.INVALID_CONFIG,
                                   f"{name}={value!r}: an integer from {lo} to {hi}")


def altered(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]],
            ) -> dict[str, str]:
    """``current`` after IncrementalAlterConfigs' ``(name, operation, value)``; raises
    ShareConfigError (nothing applied) for an unknown name, a bad value or operation."""
    out = dict(current)
    for name, op, value in ops:
        if op == SET:
            if value is None:
                raise ShareConfigError(ErrorCode.INVALID_CONFIG, f"{name}: SET without a "
                                                                 "value")
            _check(name, value)
            out[name] = value
        elif op == DELETE:
            _check(name, DEFAULTS.get(name, ""))
            out.pop(name, None)
        else:
            raise ShareConfigError(ErrorCode.INVALID_CONFIG,
                                   f"{name}: operation {op} (APPEND/SUBTRACT) does not "
                                   "apply to a share group config")
    return out


def value(configs: Mapping[str, str], name: str) -> str:
    return configs.get(name, DEFAULTS[name])


def settings(configs: Mapping[str, str], max_locks: int) -> ShareSettings:
    return ShareSettings(lock_s=int(value(configs, "share.record.lock.duration.ms")) / 1000,
                         delivery_limit=int(value(configs, "share.delivery.count.limit")),
                         max_locks=max_locks)


def reset_policy(configs: Mapping[str, str]) -> str:
    return value(configs, "share.auto.offset.reset")


def read_committed(configs: Mapping[str, str]) -> bool:
    return value(configs, "share.isolation.level") == "read_committed"


def duration_ms(policy: str) -> int:
    """The milliseconds of a ``by_duration:`` policy's ISO-8601 duration."""
    m = re.match(r"^by_duration:P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$",
                 policy)
    if m is None:
        raise ShareConfigError(ErrorCode.INVALID_CONFIG, f"not a duration: {policy!r}")
    d, h, mi, s = (m.group(i) for i in range(1, 5))
    return int(((int(d or 0) * 24 + int(h or 0)) * 60 + int(mi or 0)) * 60_000
               + float(s or 0) * 1000)


GROUP_CONFIG = 8  # DescribeConfigs' ConfigSource of a group's own config
_INT = {"share.record.lock.duration.ms", "share.delivery.count.limit",
        "share.session.timeout.ms", "share.heartbeat.interval.ms",
        "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"}


def entries(configs: Mapping[str, str], keys: Iterable[str] | None) -> list[dict[str, object]]:
    """DescribeConfigs' entries for a share group: every config (or those of ``keys``
    it knows), set ones as GROUP_CONFIG, the rest as defaults."""
    out: list[dict[str, object]] = []
    for name in sorted(DEFAULTS) if keys is None else keys:
        if name not in DEFAULTS:
            continue
        own = name in configs
        out.append({"name": name, "value": configs.get(name, DEFAULTS[name]),
                    "read_only": False, "is_default": not own,
                    "config_source": GROUP_CONFIG if own else 5, "is_sensitive": False,
                    "synonyms": [], "config_type": 3 if name in _INT else 2,
                    "documentation": None})
    return out
