"""The Kafka error code a failed write or read of a partition's log answers with
(produce, transaction markers): a fenced log means another gateway leads the partition
now, too few bookies or a timeout is retriable as NOT_ENOUGH_REPLICAS, anything else a
KAFKA_STORAGE_ERROR (logged)."""

from __future__ import annotations

import logging

from ledgerd.base.logs import fields
from ledgerd.kafka.api import ErrorCode
from ledgerd.wire.status import FencedError

__all__ = ["storage_error_code"]

log = logging.getLogger("ledgerd.kafka.gateway")


def storage_error_code(exc: BaseException) -> int:
    from ledgerd.ledgerlog import LogFencedError

    if isinstance(exc, LogFencedError | FencedError):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    name = type(exc).__name__
    if "NotEnough" in name or "Timeout" in name:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    log.warning("kafka_storage_error", extra=fields(error=repr(exc)))
    return ErrorCode.KAFKA_STORAGE_ERROR
