"""The Kafka error code a failed write or read of a partition's log answers with
(produce, transaction markers, and the reads of fetch and ListOffsets), decided by the
error's type, never its name:

- NOT_LEADER_OR_FOLLOWER (6): another writer leads. A fenced ledger or log
  (``FencedError``: ``LedgerFencedError``, ``LogFencedError``), a ledger taken over
  (``LeadershipLostError``) or closed under the writer (``LedgerClosedError``), or the
  gateway's ZooKeeper session gone (``SessionExpiredError``: its lease on leadership
  went with it). The client refreshes its metadata and sends to the leader.
- NOT_ENOUGH_REPLICAS (19): refused before anything was written. Too few writable
  bookies to place a ledger (``NotEnoughBookiesError``), or too few answering to
  recover the log's tail before writing (``LedgerRecoveryError`` that is not CORRUPT).
  The client retries; the batch was not persisted.
- REQUEST_TIMED_OUT (7): any other ``UnavailableError``, whose outcome is unknown.
  ZooKeeper unreachable or not answering in time (``MetadataUnavailableError``: kazoo's
  ConnectionLoss, OperationTimeoutError and KazooTimeoutError, after the store's
  bounded retries), the writer stopped for want of bookies or metadata
  (``LedgerUnavailableError``), no replica answering a read in time
  (``ReplicaTimeoutError``). The client retries; the batch may or may not have been
  written, and an idempotent producer's retry is recognised by its sequence.
- KAFKA_STORAGE_ERROR (56), logged: anything else.

So a ZooKeeper timeout during a produce is REQUEST_TIMED_OUT, not NOT_ENOUGH_REPLICAS:
the gateway cannot tell whether the batch reached the bookies, and NOT_ENOUGH_REPLICAS
tells a client (librdkafka) that the message was not persisted, which only a refusal
before any write can promise.
"""

from __future__ import annotations

import logging

from ledgerd.base.errors import UnavailableError
from ledgerd.base.logs import fields
from ledgerd.errors import (
    LeadershipLostError,
    LedgerClosedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
)
from ledgerd.kafka.api import ErrorCode
from ledgerd.machines.writer import FailureKind
from ledgerd.metadata.errors import SessionExpiredError
from ledgerd.wire.status import FencedError

__all__ = ["storage_error_code"]

log = logging.getLogger("ledgerd.kafka.gateway")

_NOT_LEADER = (FencedError, LeadershipLostError, LedgerClosedError, SessionExpiredError)


def storage_error_code(exc: BaseException) -> int:
    """The Kafka error for ``exc`` (see the module's table)."""
    if isinstance(exc, _NOT_LEADER):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if isinstance(exc, NotEnoughBookiesError) or (
            isinstance(exc, LedgerRecoveryError) and exc.kind is not FailureKind.CORRUPT):
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if isinstance(exc, UnavailableError):
        return ErrorCode.REQUEST_TIMED_OUT
    log.warning("kafka_storage_error", extra=fields(error=repr(exc)))
    return ErrorCode.KAFKA_STORAGE_ERROR
