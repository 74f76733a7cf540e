"""The Kafka error a failed partition write answers with, decided by the error's type
(``ledgerd/kafka/storage_errors.py``): one case per type, a name that merely looks like
a timeout no longer passes for one, and a ZooKeeper outage under a live session reaches
the gateway as MetadataUnavailableError (no kazoo type), which answers
REQUEST_TIMED_OUT."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ledgerd.base.errors import LedgerdError, UnavailableError
from ledgerd.errors import (
    LeadershipLostError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerHandleError,
    LedgerRecoveryError,
    LedgerUnavailableError,
    NotEnoughBookiesError,
    ReplicaTimeoutError,
)
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.ledgerlog import LogFencedError
from ledgerd.machines.changes import FencedChangeError
from ledgerd.machines.writer import FailureKind
from ledgerd.metadata.errors import (
    CorruptMetadataError,
    MetadataError,
    MetadataUnavailableError,
    SessionExpiredError,
)
from ledgerd.metadata.kafka_topics import TopicStore
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.zkserver import ZooKeeperServer


class LookalikeTimeoutError(LedgerdError):
    """Named like a timeout, means nothing of the kind."""


class NotEnoughCoffeeError(LedgerdError):
    """Named like too few bookies, means nothing of the kind."""


CASES: list[tuple[BaseException, int]] = [
    (LedgerFencedError(1, "recovered"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (LogFencedError("t-0", "taken over"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (FencedChangeError("fenced"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (LeadershipLostError(1, "term raised"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (LedgerClosedError(1, "handle is closed"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (SessionExpiredError("session expired"), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (NotEnoughBookiesError(3, 1), ErrorCode.NOT_ENOUGH_REPLICAS),
    (LedgerRecoveryError(1, "2 of 3 answered", FailureKind.UNAVAILABLE),
     ErrorCode.NOT_ENOUGH_REPLICAS),
    (MetadataUnavailableError("zk:2181", "get failed 5 times: ConnectionLoss"),
     ErrorCode.REQUEST_TIMED_OUT),
    (LedgerUnavailableError(1, "no replacement bookie", FailureKind.NO_BOOKIES),
     ErrorCode.REQUEST_TIMED_OUT),
    (LedgerUnavailableError(1, "metadata store failed", FailureKind.METADATA),
     ErrorCode.REQUEST_TIMED_OUT),
    (ReplicaTimeoutError(2.0), ErrorCode.REQUEST_TIMED_OUT),
    (LedgerRecoveryError(1, "replicas disagree", FailureKind.CORRUPT),
     ErrorCode.KAFKA_STORAGE_ERROR),
    (CorruptMetadataError("/ledgers/logs/t-0", "not a log record"),
     ErrorCode.KAFKA_STORAGE_ERROR),
    (MetadataError("gave up after 100 version conflicts"), ErrorCode.KAFKA_STORAGE_ERROR),
    (LedgerHandleError(1, "bad digest"), ErrorCode.KAFKA_STORAGE_ERROR),
    (LookalikeTimeoutError("x"), ErrorCode.KAFKA_STORAGE_ERROR),
    (NotEnoughCoffeeError("x"), ErrorCode.KAFKA_STORAGE_ERROR),
    (OSError("disk"), ErrorCode.KAFKA_STORAGE_ERROR),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=[type(e).__name__ + str(i)
                                                     for i, (e, _) in enumerate(CASES)])
def test_each_error_type_answers_its_kafka_error(exc: BaseException, code: int) -> None:
    assert storage_error_code(exc) == code


def test_the_unavailable_family_is_one_type() -> None:
    for cls in (NotEnoughBookiesError, ReplicaTimeoutError, MetadataUnavailableError,
                LedgerUnavailableError):
        assert issubclass(cls, UnavailableError), cls
    assert issubclass(MetadataUnavailableError, MetadataError)
    assert issubclass(LedgerUnavailableError, LedgerHandleError)


async def test_a_zookeeper_outage_during_a_produce_answers_request_timed_out(
        tmp_path: Path) -> None:
    """A dedicated server (not the shared fixture) stops under the gateway's session;
    the topic read a produce makes first fails with the metadata error, not kazoo's."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    server.start()
    try:
        store = await ZooKeeperStore.connect(server.connect_string, session_timeout=10.0,
                                             operation_timeout=1.0, retries=2)
        topics = TopicStore(store, "/ledgers/kafka")
        assert await topics.get("t") is None
        server.stop()
        with trio.fail_after(60):
            with pytest.raises(MetadataError) as info:
                await topics.get("t")
        assert type(info.value) is MetadataUnavailableError
        assert type(info.value.__cause__).__module__.startswith("kazoo")
        assert storage_error_code(info.value) == ErrorCode.REQUEST_TIMED_OUT
        await store.close()
    finally:
        server.stop()
