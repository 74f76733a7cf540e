"""The hanging-transaction tooling (KIP-664: ListTransactions, DescribeTransactions,
DescribeProducers, the abort through WriteTxnMarkers) and DescribeLogDirs, through
kafka-python 3's KafkaAdminClient against a real gateway, bookies and ZooKeeper, with a
transactional confluent-kafka producer that leaves one transaction open; the errors a
second gateway answers (NOT_COORDINATOR, NOT_LEADER_OR_FOLLOWER) with raw requests;
and the pure filters and groupings (``txn_admin.py``, ``log_dirs.py``)."""

from __future__ import annotations

import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerd.kafka.api import DECLARED, REQUESTS, RESPONSES, ApiKey, ErrorCode
from ledgerd.kafka.log_dirs import wanted_partitions
from ledgerd.kafka.producer_state import ProducerState
from ledgerd.kafka.refusals import refusal
from ledgerd.kafka.schema import Reader, decode, encode
from ledgerd.kafka.txn_admin import active_producers, describe_record, grouped, list_filter
from ledgerd.metadata.kafka_txns import TxnRecord, TxnState
from tests.kafka.conftest import GatewayProcess, KafkaCluster, running_cluster
from tests.kafka.crash_kit import wait_until
from tests.kafka.test_admin_clients import _reply
from tests.kafka.test_faults import _request

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


def _record(tid: str = "app", *, pid: int = 7, state: TxnState = TxnState.ONGOING,
            started_ms: int = 1000, partitions: tuple[tuple[str, int], ...] = ()) -> TxnRecord:
    return TxnRecord(transactional_id=tid, producer_id=pid, producer_epoch=2,
                     timeout_ms=60000, state=state, partitions=partitions,
                     started_ms=started_ms, updated_ms=started_ms)


def _filter(states: list[str] | None = None, pids: list[int] | None = None,
            duration: int = -1, pattern: str | None = None) -> Any:
    return list_filter({"state_filters": states or [], "producer_id_filters": pids or [],
                        "duration_filter": duration, "transactional_id_pattern": pattern})


# -- pure -------------------------------------------------------------------------------

def test_list_filters_follow_kafkas_rules() -> None:
    ongoing, idle = _record("a-1"), _record("b-2", pid=8, state=TxnState.COMPLETE_COMMIT)
    every = _filter()
    assert every.includes(ongoing, 5000) and every.includes(idle, 5000)
    # a state Kafka knows matches only its state (Dead: none here); others are unknown
    f = _filter(["Ongoing", "Bogus", "Dead"])
    assert f.unknown_states == ("Bogus",)
    assert f.includes(ongoing, 5000) and not f.includes(idle, 5000)
    # only unknown names: no state filter at all (Kafka's filter set stays empty)
    only_unknown = _filter(["Bogus"])
    assert only_unknown.includes(idle, 5000) and only_unknown.unknown_states == ("Bogus",)
    assert not _filter(pids=[8]).includes(ongoing, 5000)
    assert _filter(pids=[8]).includes(idle, 5000)
    # running longer than the duration: now - start > duration
    assert _filter(duration=3999).includes(ongoing, 5000)
    assert not _filter(duration=4000).includes(ongoing, 5000)
    assert _filter(duration=0).includes(_record(started_ms=-1), 5000)
    # the pattern matches the whole id (Java's matches()); empty: no filter
    assert _filter(pattern="a-.*").includes(ongoing, 0)
    assert not _filter(pattern="a-").includes(ongoing, 0)
    assert _filter(pattern="").includes(idle, 0)
    with pytest.raises(re.error):
        _filter(pattern="a-(")


def test_describe_answers_each_id_by_its_record() -> None:
    assert describe_record("x", None, coordinates=False)["error_code"] == \
        ErrorCode.NOT_COORDINATOR
    assert describe_record("x", None, coordinates=True)["error_code"] == \
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    got = describe_record("app", _record(partitions=(("t", 1), ("u", 0), ("t", 0))),
                          coordinates=True)
    assert got["error_code"] == 0 and got["transaction_state"] == "Ongoing"
    assert (got["producer_id"], got["producer_epoch"], got["transaction_start_time_ms"]) \
        == (7, 2, 1000)
    assert got["topics"] == [{"topic": "t", "partitions": [1, 0]},
                             {"topic": "u", "partitions": [0]}]
    assert grouped([]) == []


def test_active_producers_include_an_open_transaction_the_memory_forgot() -> None:
    producers = ProducerState()
    producers.note(5, 1, 0, 9, 100, timestamp=1234)
    producers.note(6, 0, 0, 4, 110)
    got = active_producers(producers, {6: 110, 9: 40}, {9: 3})
    by_pid = {p["producer_id"]: p for p in got}
    assert by_pid[5] == {"producer_id": 5, "producer_epoch": 1, "last_sequence": 9,
                         "last_timestamp": 1234, "coordinator_epoch": -1,
                         "current_txn_start_offset": -1}
    assert by_pid[6]["current_txn_start_offset"] == 110
    assert by_pid[9]["producer_epoch"] == 3 and by_pid[9]["current_txn_start_offset"] == 40
    assert by_pid[9]["last_sequence"] == by_pid[9]["last_timestamp"] == -1
    assert by_pid[6]["last_timestamp"] == -1


def test_log_dirs_describe_what_exists() -> None:
    counts = {"b": 2, "a": 1}
    assert wanted_partitions(None, counts) == [("a", [0]), ("b", [0, 1])]
    asked = [{"topic": "b", "partitions": [1, 5, 1]}, {"topic": "zz", "partitions": [0]}]
    assert wanted_partitions(asked, counts) == [("b", [1])]


@pytest.mark.parametrize("api", [ApiKey.LIST_TRANSACTIONS, ApiKey.DESCRIBE_TRANSACTIONS,
                                 ApiKey.DESCRIBE_PRODUCERS, ApiKey.DESCRIBE_LOG_DIRS])
def test_refusals_of_the_new_apis_encode_at_every_version(api: ApiKey) -> None:
    bodies = {
        ApiKey.LIST_TRANSACTIONS: {"state_filters": [], "producer_id_filters": []},
        ApiKey.DESCRIBE_TRANSACTIONS: {"transactional_ids": ["a", "b"]},
        ApiKey.DESCRIBE_PRODUCERS: {"topics": [{"name": "t", "partition_indexes": [0, 1]}]},
        ApiKey.DESCRIBE_LOG_DIRS: {"topics": None},
    }
    low, high = DECLARED[api]
    for version in range(low, high + 1):
        reply = refusal(api, bodies[api], ErrorCode.UNSUPPORTED_VERSION)
        raw = b"".join(encode(RESPONSES[api], version, reply))
        back = decode(RESPONSES[api], version, Reader(raw))
        if api is ApiKey.DESCRIBE_PRODUCERS:
            assert [p["error_code"] for p in back["topics"][0]["partitions"]] == [35, 35]
        elif api is ApiKey.DESCRIBE_TRANSACTIONS:
            assert [t["error_code"] for t in back["transaction_states"]] == [35, 35]
        elif api is ApiKey.LIST_TRANSACTIONS or version >= 3:
            assert back["error_code"] == 35
        assert REQUESTS[api].is_flexible(version) == RESPONSES[api].is_flexible(version)


# -- through kafka-python's KafkaAdminClient --------------------------------------------

def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(BOUND_S)


def _producer(bootstrap: str, tid: str) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "transaction.timeout.ms": 600000})
    p.init_transactions(BOUND_S)
    return p


def _end_offset(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-admin-probe"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition),
                                           BOUND_S)[1])
    finally:
        c.close()


def _read_committed(bootstrap: str, topic: str, until: bytes) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-admin-reader",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + BOUND_S
        while until not in got:
            assert time.monotonic() < deadline, f"{until!r} not read; read {got}"
            for m in c.consume(100, 0.5):
                assert not m.error(), m.error()
                got.append(m.value())
    finally:
        c.close()
    return got


def _sizes(admin: Any, topic: str) -> dict[int, int]:
    (broker,) = admin.describe_log_dirs({topic: [0, 1]})
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0 and log_dir["log_dir"].startswith("/"), log_dir
    return {p["partition_index"]: p["partition_size"]
            for t in log_dir["topics"] if t["name"] == topic for p in t["partitions"]}


def test_admin_client_finds_describes_and_aborts_a_hanging_transaction(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Producer
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin._transactions import AbortTransactionSpec, TransactionState
    from kafka.errors import TransactionalIdNotFoundError

    bootstrap, topic = kafka_cluster.bootstrap, "txn-admin"
    _create(bootstrap, topic, 2)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        assert _sizes(admin, topic) == {0: 0, 1: 0}
        done = _producer(bootstrap, "txn-admin-done")
        done.begin_transaction()
        for i in range(3):
            done.produce(topic, value=b"c%d" % i, partition=0)
        done.commit_transaction(BOUND_S)
        first = _end_offset(bootstrap, topic, 0)  # the open transaction's first offset
        assert first == 4  # 3 records and the commit marker
        before_ms = int(time.time() * 1000)
        hanging = _producer(bootstrap, "txn-admin-open")
        hanging.begin_transaction()
        for i in range(2):
            hanging.produce(topic, value=b"open%d" % i, partition=0)
        assert hanging.flush(BOUND_S) == 0  # written, never committed

        def ours(**filters: Any) -> dict[str, Any]:
            (listings,) = admin.list_transactions(**filters).values()
            return {t.transactional_id: t for t in listings
                    if t.transactional_id.startswith("txn-admin-")}

        # the committed one completes a moment after the commit is answered
        listed = wait_until(lambda: (
            lambda got: got if got.get("txn-admin-done") is not None and
            got["txn-admin-done"].state is TransactionState.COMPLETE_COMMIT else None)(ours()),
            "the committed transaction completes")
        assert listed["txn-admin-open"].state is TransactionState.ONGOING
        pid = listed["txn-admin-open"].producer_id
        assert set(ours(state_filters=["Ongoing"])) == {"txn-admin-open"}
        assert set(ours(producer_id_filters=[pid])) == {"txn-admin-open"}
        assert "txn-admin-open" in ours(duration_filter_ms=0)
        assert "txn-admin-open" not in ours(duration_filter_ms=3_600_000)
        assert set(ours(transactional_id_pattern="txn-admin-op.*")) == {"txn-admin-open"}
        assert ours(transactional_id_pattern="txn-admin-op") == {}

        desc = admin.describe_transactions(["txn-admin-open"])["txn-admin-open"]
        assert desc.state is TransactionState.ONGOING and desc.producer_id == pid
        assert desc.topic_partitions == {TopicPartition(topic, 0)}
        assert before_ms <= desc.transaction_start_time_ms <= int(time.time() * 1000)
        assert desc.transaction_timeout_ms == 600000
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["txn-admin-never"])

        state = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
        by_pid = {p.producer_id: p for p in state.active_producers}
        assert by_pid[pid].current_transaction_start_offset == first
        assert by_pid[pid].producer_epoch == desc.producer_epoch
        assert by_pid[pid].last_sequence >= 0 and by_pid[pid].coordinator_epoch == -1
        assert before_ms - 1000 <= by_pid[pid].last_timestamp <= int(time.time() * 1000)
        done_pid = listed["txn-admin-done"].producer_id
        assert by_pid[done_pid].current_transaction_start_offset == -1

        # find-hanging's threshold is max_transaction_timeout_ms + 5 minutes: a
        # negative timeout brings it down to 1 ms so the open transaction counts
        found = admin.find_hanging_transactions(max_transaction_timeout_ms=-5 * 60 * 1000 + 1)
        mine = [h for h in found if h["transactional_id"].startswith("txn-admin-")]
        assert [(h["transactional_id"], h["producer_id"], h["topic_partitions"])
                for h in mine] == [("txn-admin-open", pid, [TopicPartition(topic, 0)])]
        # at the default threshold (15 + 5 minutes) it is not hanging yet
        assert not [h for h in admin.find_hanging_transactions()
                    if h["transactional_id"].startswith("txn-admin-")]

        # the partition's sizes grew by what was written
        sizes = _sizes(admin, topic)
        assert sizes[0] > 0 and sizes[1] == 0, sizes

        # the abort: read_committed readers move past the open transaction
        admin.abort_transaction(AbortTransactionSpec(
            topic_partition=TopicPartition(topic, 0), producer_id=pid,
            producer_epoch=desc.producer_epoch))
        state = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
        assert {p.producer_id: p.current_transaction_start_offset
                for p in state.active_producers}[pid] == -1
        plain = Producer({"bootstrap.servers": bootstrap})
        plain.produce(topic, value=b"after", partition=0)
        assert plain.flush(BOUND_S) == 0
        got = _read_committed(bootstrap, topic, b"after")
        assert got == [b"c0", b"c1", b"c2", b"after"], got
        assert _sizes(admin, topic)[0] > sizes[0]
        hanging.abort_transaction(BOUND_S)  # its coordinator ends it too (nothing left)
    finally:
        admin.close()


def _ask(sock: socket.socket, api: ApiKey, version: int, body: dict[str, Any],
         ) -> dict[str, Any]:
    sock.sendall(_request(api, version, body))
    return _reply(sock, api, version)


def test_an_unknown_state_filter_and_a_bad_pattern_are_answered(
        kafka_cluster: KafkaCluster) -> None:
    host, port = kafka_cluster.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        got = _ask(sock, ApiKey.LIST_TRANSACTIONS, 1, {
            "state_filters": ["Ongoing", "Hanging"], "producer_id_filters": [],
            "duration_filter": -1})
        assert got["error_code"] == 0 and got["unknown_state_filters"] == ["Hanging"]
        got = _ask(sock, ApiKey.LIST_TRANSACTIONS, 2, {
            "state_filters": [], "producer_id_filters": [],
            "transactional_id_pattern": "a-("})
        assert got["error_code"] == ErrorCode.INVALID_REQUEST
        got = _ask(sock, ApiKey.DESCRIBE_LOG_DIRS, 0, {"topics": [
            {"topic": "no-such-topic", "partitions": [0]}]})
        assert [r["topics"] for r in got["results"]] == [[]]


def test_the_other_gateway_is_not_coordinator_nor_leader(
        zk_chroot: str, tmp_path: Path) -> None:
    """Two gateways: the one that does not coordinate a transactional id answers
    NOT_COORDINATOR for it, the one that does not lead a partition
    NOT_LEADER_OR_FOLLOWER; each lists only the ids it coordinates."""
    from kafka import KafkaAdminClient

    from tests.kafka.crash_kit import sees_only

    a = GatewayProcess(zk_chroot, tmp_path / "a.log")
    b = GatewayProcess(zk_chroot, tmp_path / "b.log")
    with running_cluster(tmp_path, zk_chroot, 3, a):
        try:
            b.start()
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            _create(a.bootstrap, "txn-two", 1)
            both = f"{a.bootstrap},{b.bootstrap}"
            tids = [f"txn-two-{i}" for i in range(4)]
            for tid in tids:
                _producer(both, tid)  # a record each, Empty
            admin = KafkaAdminClient(bootstrap_servers=both, request_timeout_ms=30000)
            try:
                by_node = admin.list_transactions()
                assert len(by_node) == 2
                listed = [{t.transactional_id for t in ts} & set(tids)
                          for ts in by_node.values()]
                assert not listed[0] & listed[1] and listed[0] | listed[1] == set(tids)
                assert all(listed), listed  # rendezvous spreads four ids over both
            finally:
                admin.close()
            leads: dict[int, int] = {}
            for gw in (a, b):
                host, port = gw.bootstrap.split(":")
                with socket.create_connection((host, int(port)), timeout=30) as sock:
                    got = _ask(sock, ApiKey.DESCRIBE_TRANSACTIONS, 0,
                               {"transactional_ids": tids})
                    codes = {t["transactional_id"]: t["error_code"]
                             for t in got["transaction_states"]}
                    assert set(codes.values()) == {0, ErrorCode.NOT_COORDINATOR}, codes
                    got = _ask(sock, ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [
                        {"name": "txn-two", "partition_indexes": [0, 9]}]})
                    (p0, p9) = got["topics"][0]["partitions"]
                    assert p9["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    leads[gw.port] = p0["error_code"]
            assert sorted(leads.values()) == [0, ErrorCode.NOT_LEADER_OR_FOLLOWER], leads
        finally:
            if b.running:
                b.stop(signal.SIGKILL)



def test_acls_hide_and_refuse_what_the_principal_may_not_describe(
        kafka_cluster: KafkaCluster) -> None:
    """Kafka's rules: ListTransactions lists only the ids the principal may DESCRIBE,
    DescribeTransactions needs DESCRIBE on each id, DescribeProducers READ on each
    topic, DescribeLogDirs DESCRIBE on the cluster."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from ledgerd.kafka.authorization import needs
    from ledgerd.metadata.kafka_acls import AclOperation as Op
    from ledgerd.metadata.kafka_acls import ResourceType as Kind

    assert [(n.operation, n.resource.type) for n in needs(
        ApiKey.DESCRIBE_LOG_DIRS, {"topics": None})] == [(Op.DESCRIBE, Kind.CLUSTER)]
    assert needs(ApiKey.LIST_TRANSACTIONS, {}) == []  # filtered by its handler

    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-acl", 1)
    for tid in ("txn-acl-shown", "txn-acl-hidden"):
        _producer(bootstrap, tid)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    bindings = [
        AclBinding(ResourceType.TRANSACTIONAL_ID, "txn-acl-hidden", ResourcePatternType.LITERAL,
                   "User:*", "*", AclOperation.DESCRIBE, AclPermissionType.DENY),
        AclBinding(ResourceType.TOPIC, "txn-acl", ResourcePatternType.LITERAL,
                   "User:*", "*", AclOperation.READ, AclPermissionType.DENY)]
    for future in admin.create_acls(bindings).values():
        future.result(BOUND_S)
    host, port = bootstrap.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            got = _ask(sock, ApiKey.LIST_TRANSACTIONS, 0,
                       {"state_filters": [], "producer_id_filters": []})
            listed = {t["transactional_id"] for t in got["transaction_states"]}
            assert "txn-acl-shown" in listed and "txn-acl-hidden" not in listed
            got = _ask(sock, ApiKey.DESCRIBE_TRANSACTIONS, 0,
                       {"transactional_ids": ["txn-acl-hidden"]})
            assert [t["error_code"] for t in got["transaction_states"]] == [
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
            got = _ask(sock, ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [
                {"name": "txn-acl", "partition_indexes": [0]}]})
            assert [p["error_code"] for p in got["topics"][0]["partitions"]] == [
                ErrorCode.TOPIC_AUTHORIZATION_FAILED]
    finally:
        for binding in bindings:
            wanted = AclBindingFilter(binding.restype, binding.name,
                                      ResourcePatternType.LITERAL, None, None,
                                      AclOperation.ANY, AclPermissionType.ANY)
            for future in admin.delete_acls([wanted]).values():
                future.result(BOUND_S)
