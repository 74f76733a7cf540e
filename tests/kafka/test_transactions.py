"""Kafka transactions through the gateway (issue 47, item 4), with a stock client
(confluent-kafka, librdkafka) against real gateway processes, bookies and ZooKeeper:
a committed transaction is seen by a read_committed consumer, an aborted one only by
a read_uncommitted one; a second producer with the same transactional id fences the
first (its transaction aborted, its commit refused); offsets sent with a transaction
become the group's only if it commits; and a gateway killed (SIGKILL) in the middle of
a transaction leaves it to the next coordinator, which aborts it once its producer
stays silent past transaction.timeout.ms, so read_committed consumers move on, and
nothing committed is lost."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.conftest import GatewayProcess, KafkaCluster, running_cluster

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


def _create(bootstrap: str, topic: str, partitions: int, **conf: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **conf})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(BOUND_S)


def _producer(bootstrap: str, tid: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "linger.ms": 5, "socket.timeout.ms": 6000, **extra})
    p.init_transactions(BOUND_S)
    return p


def _read(bootstrap: str, topic: str, partitions: int, isolation: str,
          until: set[bytes], **conf: Any) -> list[tuple[int, int, bytes]]:
    """Every (partition, offset, value) from the beginning until each value of ``until``
    was read (``until`` is committed last, so what came before it is all there)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txn-read-{isolation}",
                  "enable.auto.commit": False, "isolation.level": isolation, **conf})
    got: list[tuple[int, int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + BOUND_S
        while not until <= {v for _, _, v in got}:
            assert time.monotonic() < deadline, (
                f"{isolation}: {sorted(until - {v for _, _, v in got})} not read in "
                f"{BOUND_S} s; read {got}")
            for m in c.consume(100, 0.5):
                assert not m.error(), m.error()
                got.append((m.partition(), m.offset(), m.value()))
    finally:
        c.close()
    return got


def _values(records: list[tuple[int, int, bytes]]) -> list[bytes]:
    return sorted(v for _, _, v in records)


def test_committed_is_read_and_aborted_is_skipped_by_read_committed(
        kafka_cluster: KafkaCluster) -> None:
    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-basic", 2)
    p = _producer(bootstrap, "txn-basic-app")
    p.begin_transaction()
    for i in range(6):
        p.produce("txn-basic", value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(BOUND_S)
    p.begin_transaction()
    for i in range(6):
        p.produce("txn-basic", value=b"a%d" % i, partition=i % 2)
    p.flush(BOUND_S)  # written to the logs, then aborted
    p.abort_transaction(BOUND_S)
    p.begin_transaction()
    for part in range(2):
        p.produce("txn-basic", value=b"end%d" % part, partition=part)
    p.commit_transaction(BOUND_S)
    ends = {b"end0", b"end1"}
    committed = _read(bootstrap, "txn-basic", 2, "read_committed", ends)
    assert _values(committed) == sorted([b"c%d" % i for i in range(6)] + list(ends))
    uncommitted = _read(bootstrap, "txn-basic", 2, "read_uncommitted", ends)
    assert _values(uncommitted) == sorted([b"c%d" % i for i in range(6)]
                                          + [b"a%d" % i for i in range(6)] + list(ends))
    # the offsets are the log's: the markers take one each, between the transactions
    assert [o for part, o, _ in sorted(committed) if part == 0] == [0, 1, 2, 8]


def test_a_new_producer_with_the_same_id_fences_the_old_one(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import KafkaException

    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-zombie", 1)
    old = _producer(bootstrap, "txn-zombie-app")
    old.begin_transaction()
    old.produce("txn-zombie", value=b"zombie-0", partition=0)
    old.flush(BOUND_S)
    new = _producer(bootstrap, "txn-zombie-app")  # aborts old's transaction, fences it
    new.begin_transaction()
    new.produce("txn-zombie", value=b"new-0", partition=0)
    new.commit_transaction(BOUND_S)
    old.produce("txn-zombie", value=b"zombie-1", partition=0)
    with pytest.raises(KafkaException) as exc:
        old.commit_transaction(BOUND_S)
    err = exc.value.args[0]
    assert err.fatal() or err.txn_requires_abort(), err
    assert "fenced" in err.str().lower() or "epoch" in err.str().lower(), err
    committed = _read(bootstrap, "txn-zombie", 1, "read_committed", {b"new-0"})
    assert _values(committed) == [b"new-0"]


def test_offsets_sent_with_a_transaction_count_only_if_it_commits(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-in", 1)
    _create(bootstrap, "txn-out", 1)
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        plain.produce("txn-in", value=b"in%d" % i, partition=0)
    assert plain.flush(BOUND_S) == 0
    # read_uncommitted: its OffsetFetch does not ask for stable offsets (KIP-447), so it
    # is answered while a transaction holds offsets of the group (the next test)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-eos",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition("txn-in", 0, 0)])
    p = _producer(bootstrap, "txn-eos-app")

    def committed() -> int:
        return int(consumer.committed([TopicPartition("txn-in", 0)], BOUND_S)[0].offset)

    try:
        p.begin_transaction()
        p.produce("txn-out", value=b"out-aborted", partition=0)
        p.send_offsets_to_transaction([TopicPartition("txn-in", 0, 5)],
                                      consumer.consumer_group_metadata(), BOUND_S)
        assert committed() < 0  # pending: not the group's yet
        p.abort_transaction(BOUND_S)
        assert committed() < 0
        p.begin_transaction()
        p.produce("txn-out", value=b"out-committed", partition=0)
        p.send_offsets_to_transaction([TopicPartition("txn-in", 0, 7)],
                                      consumer.consumer_group_metadata(), BOUND_S)
        assert committed() < 0
        p.commit_transaction(BOUND_S)
        assert committed() == 7
    finally:
        consumer.close()
    out = _read(bootstrap, "txn-out", 1, "read_committed", {b"out-committed"})
    assert _values(out) == [b"out-committed"]


def test_a_read_committed_consumer_waits_for_the_offsets_a_transaction_holds(
        kafka_cluster: KafkaCluster) -> None:
    """KIP-447: OffsetFetch with require_stable (librdkafka asks it when
    isolation.level is read_committed) answers UNSTABLE_OFFSET_COMMIT for a partition
    whose offsets an open transaction holds, and the consumer asks again until the
    transaction ends: it starts from the transaction's offsets, not from the ones
    before it (which a consume-transform-produce loop would process twice)."""
    import threading

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-st-in", 2)

    def consumer(isolation: str) -> Any:
        return Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-st",
                         "enable.auto.commit": False, "isolation.level": isolation})

    stable, plain = consumer("read_committed"), consumer("read_uncommitted")
    p = _producer(bootstrap, "txn-st-app")
    both = [TopicPartition("txn-st-in", 0), TopicPartition("txn-st-in", 1)]

    def offsets(c: Any, timeout: float) -> list[int]:
        return [int(tp.offset) for tp in c.committed(both, timeout)]

    try:
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("txn-st-in", 0, 5)],
                                      stable.consumer_group_metadata(), BOUND_S)
        assert offsets(plain, BOUND_S) == [-1001, -1001]  # answered, pending not shown
        with pytest.raises(KafkaException) as held:
            offsets(stable, 3)  # retried for as long as the transaction holds them
        assert held.value.args[0].code() == KafkaError._TIMED_OUT, held.value
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(offsets(stable, BOUND_S)))
        waiter.start()
        waiter.join(1)  # it must still be waiting: the transaction holds the offsets
        assert waiter.is_alive()  # still waiting
        committing = time.monotonic()
        p.commit_transaction(BOUND_S)
        waiter.join(BOUND_S)
        assert got == [[5, -1001]], got
        assert time.monotonic() >= committing
        # an aborted transaction's offsets never stand: the committed ones are stable
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("txn-st-in", 1, 8)],
                                      stable.consumer_group_metadata(), BOUND_S)
        p.abort_transaction(BOUND_S)
        assert offsets(stable, BOUND_S) == [5, -1001]
        # and the next transaction of the same producer holds them again
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("txn-st-in", 1, 9)],
                                      stable.consumer_group_metadata(), BOUND_S)
        with pytest.raises(KafkaException):
            offsets(stable, 3)
        p.commit_transaction(BOUND_S)
        assert offsets(stable, BOUND_S) == [5, 9]
    finally:
        stable.close()
        plain.close()


def test_a_zombie_consumer_generation_cannot_commit_offsets_through_a_transaction(
        kafka_cluster: KafkaCluster) -> None:
    """KIP-447 with a subscribed consumer: offsets sent with its current group metadata
    commit with the transaction; sent with the metadata of a generation the group has
    left behind (a zombie whose partitions may have moved), they are refused and the
    transaction must abort."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap = kafka_cluster.bootstrap
    _create(bootstrap, "txn-zin", 2)
    conf = {"bootstrap.servers": bootstrap, "group.id": "txn-zombie",
            "enable.auto.commit": False, "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300}

    def member(c: Any) -> Any:
        """Poll until ``c`` has an assignment: its group metadata then names its
        member id and generation."""
        deadline = time.monotonic() + BOUND_S
        while not c.assignment():
            assert time.monotonic() < deadline, "no assignment within the bound"
            c.poll(0.2)
        return c.consumer_group_metadata()

    first = Consumer(conf)
    second = Consumer(conf)
    p = _producer(bootstrap, "txn-zombie-app")
    try:
        first.subscribe(["txn-zin"])
        old = member(first)
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("txn-zin", 0, 3)], old, BOUND_S)
        p.commit_transaction(BOUND_S)
        assert first.committed([TopicPartition("txn-zin", 0)], BOUND_S)[0].offset == 3
        second.subscribe(["txn-zin"])  # a rebalance: the group's generation moves on
        deadline = time.monotonic() + BOUND_S
        while not (first.assignment() and second.assignment()
                   and len(first.assignment()) == 1):
            assert time.monotonic() < deadline, "no rebalance within the bound"
            first.poll(0.1)
            second.poll(0.1)
        p.begin_transaction()
        with pytest.raises(KafkaException) as refused:
            p.send_offsets_to_transaction([TopicPartition("txn-zin", 0, 9)], old, BOUND_S)
        assert refused.value.args[0].txn_requires_abort(), refused.value
        p.abort_transaction(BOUND_S)
        assert first.committed([TopicPartition("txn-zin", 0)], BOUND_S)[0].offset == 3
    finally:
        first.close()
        second.close()


def test_a_transaction_left_by_a_killed_gateway_is_aborted_and_commits_survive(
        zk_chroot: str, tmp_path: Path) -> None:
    """A producer commits one transaction, writes a second (acknowledged) and is gone;
    the gateway is killed with SIGKILL. The next gateway finds the second transaction
    ONGOING in ZooKeeper and aborts it once transaction.timeout.ms has passed: a
    read_committed consumer is held at its first offset until then (the LSO), then
    reads on past it, without its records, up to what another producer committed
    after the crash. Everything committed before the crash is still there."""
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "txn-crash", 2)
        first = _producer(gw.bootstrap, "txn-crash-a", **{"transaction.timeout.ms": 4000,
                                                           "socket.timeout.ms": 4000})
        first.begin_transaction()
        for i in range(10):
            first.produce("txn-crash", value=b"before-%d" % i, partition=i % 2)
        first.commit_transaction(BOUND_S)
        first.begin_transaction()
        for i in range(10):
            first.produce("txn-crash", value=b"open-%d" % i, partition=i % 2)
        assert first.flush(BOUND_S) == 0  # acknowledged, never committed
        gw.restart(signal.SIGKILL)
        second = _producer(gw.bootstrap, "txn-crash-b")
        second.begin_transaction()
        for i in range(10):
            second.produce("txn-crash", value=b"after-%d" % i, partition=i % 2)
        second.commit_transaction(BOUND_S)
        got = _read(gw.bootstrap, "txn-crash", 2, "read_committed",
                    {b"after-%d" % i for i in range(10)})
        assert _values(got) == sorted([b"before-%d" % i for i in range(10)]
                                      + [b"after-%d" % i for i in range(10)])
        assert "kafka_txn_timed_out" in gw.log_text() or \
            "kafka_txn_timed_out" in (tmp_path / "gateway.log").read_text()
        # the first producer was fenced by the abort: its commit is refused
        from confluent_kafka import KafkaException
        with pytest.raises(KafkaException):
            first.commit_transaction(BOUND_S)


def test_one_phase_commits_survive_a_gateway_kill_and_an_open_one_is_aborted(
        zk_chroot: str, tmp_path: Path) -> None:
    """One-partition transactions end in one phase (their marker alone) and the ones
    after the first begin under its stored record without writing it: five commit, a
    sixth writes its records (acknowledged) and its producer goes silent, and the
    gateway is killed with SIGKILL. The stored record still says ONGOING on that
    partition (nothing of the sixth was written to ZooKeeper), and that is enough:
    the next gateway aborts it past transaction.timeout.ms, a read_committed consumer
    reads every committed record and none of the sixth's, and another producer's
    commit after the crash is read too."""
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "txn-one", 1)
        first = _producer(gw.bootstrap, "txn-one-a", **{"transaction.timeout.ms": 4000,
                                                         "socket.timeout.ms": 4000})
        for t in range(5):
            first.begin_transaction()
            for i in range(10):
                first.produce("txn-one", value=b"kept-%d-%d" % (t, i))
            first.commit_transaction(BOUND_S)
        first.begin_transaction()
        for i in range(10):
            first.produce("txn-one", value=b"open-%d" % i)
        assert first.flush(BOUND_S) == 0  # acknowledged, never committed
        gw.restart(signal.SIGKILL)
        second = _producer(gw.bootstrap, "txn-one-b")
        second.begin_transaction()
        for i in range(10):
            second.produce("txn-one", value=b"after-%d" % i)
        second.commit_transaction(BOUND_S)
        got = _read(gw.bootstrap, "txn-one", 1, "read_committed",
                    {b"after-%d" % i for i in range(10)})
        assert _values(got) == sorted([b"kept-%d-%d" % (t, i) for t in range(5)
                                       for i in range(10)]
                                      + [b"after-%d" % i for i in range(10)])
        everything = _read(gw.bootstrap, "txn-one", 1, "read_uncommitted",
                           {b"after-%d" % i for i in range(10)})
        assert {b"open-%d" % i for i in range(10)} <= set(_values(everything))


def test_a_commit_decided_before_a_gateway_is_killed_is_completed_by_the_next(
        zk_chroot: str, tmp_path: Path) -> None:
    """The bookies are stopped (SIGSTOP) so the commit's markers cannot be written;
    the producer asks to commit, the gateway makes the decision durable
    (PREPARE_COMMIT in ZooKeeper) and is killed with SIGKILL before any marker is
    written. The bookies resume and a fresh gateway starts: it finds the prepared
    commit, writes the markers, and the producer's commit call (retried against the
    new gateway) succeeds; a read_committed consumer reads the transaction."""
    import os
    import threading

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw) as cluster:
        _create(gw.bootstrap, "txn-prepared", 2)
        p = _producer(gw.bootstrap, "txn-prepared-app",
                      **{"transaction.timeout.ms": 60000})
        p.begin_transaction()
        for i in range(10):
            p.produce("txn-prepared", value=b"kept-%d" % i, partition=i % 2)
        assert p.flush(BOUND_S) == 0
        pids = [b.pid for b in cluster.bookies]
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                p.commit_transaction(BOUND_S * 2)
                outcome.append(None)
            except BaseException as exc:  # reported by the test's thread
                outcome.append(exc)

        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            committer = threading.Thread(target=commit, daemon=True)
            committer.start()
            deadline = time.monotonic() + BOUND_S
            while "kafka_txn_ending" not in (tmp_path / "gateway.log").read_text():
                assert time.monotonic() < deadline, "the commit was never prepared"
                time.sleep(0.05)
            gw.stop(signal.SIGKILL)
        finally:
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)
        gw.start()
        committer.join(BOUND_S * 2)
        assert outcome == [None], outcome
        got = _read(gw.bootstrap, "txn-prepared", 2, "read_committed",
                    {b"kept-%d" % i for i in range(10)})
        assert _values(got) == sorted(b"kept-%d" % i for i in range(10))
        assert "kafka_txn_completed" in (tmp_path / "gateway.log").read_text()


def _split_topic(nodes: list[int], parts: int) -> str:
    """A topic name whose partitions rendezvous hashing spreads over every one of
    ``nodes`` (for some names it gives one gateway all of them)."""
    from ledgerd.kafka import gateway

    for i in range(1000):
        name = f"txn-spread-{i}"
        owners = {max(nodes, key=lambda n: gateway.rank(n, f"{name}/{p}"))
                  for p in range(parts)}
        if owners == set(nodes):
            return name
    raise AssertionError(f"no topic name spreads {parts} partitions over {nodes}")


def _spread(a: GatewayProcess, b: GatewayProcess, tmp_path: Path, zk_chroot: str,
            **conf: Any) -> None:
    """Two gateways lead the partitions of one topic between them; one of them
    coordinates the transaction and sends the markers of the other's partitions to it
    (WriteTxnMarkers). A commit is read on every partition, an abort on none."""
    from tests.kafka.crash_kit import sees_only, status, wait_until

    with running_cluster(tmp_path, zk_chroot, 3, a):
        try:
            b.start()
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            parts = 6
            topic = _split_topic([int(n) for n in status(a)["gateways"]], parts)
            _create(a.bootstrap, topic, parts, **conf)
            both = f"{a.bootstrap},{b.bootstrap}"
            p = _producer(both, "txn-spread-app", **conf)
            p.begin_transaction()
            for i in range(parts * 2):
                p.produce(topic, value=b"c%d" % i, partition=i % parts)
            p.commit_transaction(BOUND_S)
            p.begin_transaction()
            for i in range(parts * 2):
                p.produce(topic, value=b"a%d" % i, partition=i % parts)
            p.flush(BOUND_S)
            p.abort_transaction(BOUND_S)
            p.begin_transaction()
            for i in range(parts):
                p.produce(topic, value=b"end%d" % i, partition=i)
            p.commit_transaction(BOUND_S)
            led = [{w for w in status(g)["partitions_written"] if w.startswith(f"{topic}/")}
                   for g in (a, b)]
            # each gateway wrote some of the partitions (the name was chosen so that it
            # would); if not, ownership moved during the test: the logs say why
            assert led[0] and led[1], (led, [
                line for g in (a, b) for line in g.log_path.read_text().splitlines()
                if "moved" in line or "dropped" in line or "lease" in line])
            ends = {b"end%d" % i for i in range(parts)}
            got = _read(both, topic, parts, "read_committed", ends, **conf)
            assert _values(got) == sorted([b"c%d" % i for i in range(parts * 2)]
                                          + list(ends))
        finally:
            if b.running:
                b.stop(signal.SIGKILL)


def test_a_transaction_over_partitions_of_two_gateways_ends_on_both(
        zk_chroot: str, tmp_path: Path) -> None:
    _spread(GatewayProcess(zk_chroot, tmp_path / "a.log"),
            GatewayProcess(zk_chroot, tmp_path / "b.log"), tmp_path, zk_chroot)


def test_secure_gateways_send_each_other_markers_over_tls_and_sasl(
        zk_chroot: str, tmp_path: Path) -> None:
    """The same over listeners that require TLS and SASL PLAIN: a gateway reaches the
    other over TLS and authenticates as the admin principal of its peer token."""
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "gateway.pem"))
    principals = tmp_path / "principals.toml"
    for name, roles in (("app", "client,admin"), ("gateways", "admin")):
        made = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "gentoken",
                               name, "--roles", roles, "--token-file", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=60, check=True)
        with principals.open("a") as f:
            f.write(made.stdout)
    env = {"LEDGERD_GATEWAY_TLS_CERTIFICATE_PATH": str(tmp_path / "gateway.pem"),
           "LEDGERD_GATEWAY_TLS_KEY_PATH": str(tmp_path / "gateway.pem"),
           "LEDGERD_GATEWAY_TLS_TRUST_PATH": str(tmp_path / "ca.pem"),
           "LEDGERD_GATEWAY_PRINCIPALS_FILE": str(principals),
           "LEDGERD_GATEWAY_PEER_TOKEN_FILE": str(tmp_path / "gateways")}
    _spread(GatewayProcess(zk_chroot, tmp_path / "a.log", env=env),
            GatewayProcess(zk_chroot, tmp_path / "b.log", env=env), tmp_path, zk_chroot,
            **{"security.protocol": "sasl_ssl", "ssl.ca.location": str(tmp_path / "ca.pem"),
               "sasl.mechanisms": "PLAIN", "sasl.username": "app",
               "sasl.password": (tmp_path / "app").read_text().strip()})


def test_a_batch_arriving_after_its_transaction_ended_is_refused_not_left_hanging(
        kafka_cluster: KafkaCluster) -> None:
    """Jepsen's "hanging transaction": a producer's batch that reaches the partition
    after the abort marker of its transaction (a retry, a late request) would open a
    transaction nobody ends, and hold every read_committed consumer at its offset for
    good. The gateway refuses it (INVALID_TXN_STATE), and the LSO stays the high
    watermark. A zombie's batch of an older epoch is refused INVALID_PRODUCER_EPOCH.
    Spoken at the protocol level, as a client that sends what it likes."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from ledgerd.kafka.api import ApiKey, ErrorCode
    from tests.kafka.test_faults import _connect, _reply, _request

    _create(kafka_cluster.bootstrap, "txn-late", 1)
    sock = _connect(kafka_cluster)

    def call(api: ApiKey, version: int, body: dict[str, Any]) -> dict[str, Any]:
        sock.sendall(_request(api, version, body))
        return _reply(sock, api, version)

    def batch(pid: int, epoch: int, seq: int) -> bytes:
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                      producer_id=pid, producer_epoch=epoch,
                                      base_sequence=seq, batch_size=1 << 20)
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"late", headers=[])
        return bytes(b.build())

    def produce(pid: int, epoch: int, seq: int) -> int:
        got = call(ApiKey.PRODUCE, 7, {
            "transactional_id": "txn-late-app", "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": "txn-late", "partition_data": [
                {"index": 0, "records": batch(pid, epoch, seq)}]}]})
        return int(got["responses"][0]["partition_responses"][0]["error_code"])

    def latest(isolation: int) -> int:
        got = call(ApiKey.LIST_OFFSETS, 2, {"replica_id": -1, "isolation_level": isolation,
                                            "topics": [{"name": "txn-late", "partitions": [
                                                {"partition_index": 0, "timestamp": -1}]}]})
        return int(got["topics"][0]["partitions"][0]["offset"])

    try:
        init = call(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": "txn-late-app",
                                                 "transaction_timeout_ms": 60000})
        assert init["error_code"] == 0, init
        pid, epoch = init["producer_id"], init["producer_epoch"]
        added = call(ApiKey.ADD_PARTITIONS_TO_TXN, 0, {
            "transactional_id": "txn-late-app", "producer_id": pid, "producer_epoch": epoch,
            "topics": [{"name": "txn-late", "partitions": [0]}]})
        assert added["results"][0]["results"][0]["error_code"] == 0, added
        assert produce(pid, epoch, 0) == 0
        assert (latest(1), latest(0)) == (0, 1)  # the open transaction holds the LSO
        ended = call(ApiKey.END_TXN, 1, {"transactional_id": "txn-late-app",
                                         "producer_id": pid, "producer_epoch": epoch,
                                         "committed": False})
        assert ended["error_code"] == 0, ended
        assert (latest(1), latest(0)) == (2, 2)  # batch and abort marker
        assert produce(pid, epoch, 1) == ErrorCode.INVALID_TXN_STATE
        assert (latest(1), latest(0)) == (2, 2)  # nothing hangs
        again = call(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": "txn-late-app",
                                                  "transaction_timeout_ms": 60000})
        assert (again["error_code"], again["producer_epoch"]) == (0, epoch + 1)
        assert produce(pid, epoch, 2) == ErrorCode.INVALID_PRODUCER_EPOCH  # the zombie
        stale = call(ApiKey.END_TXN, 1, {"transactional_id": "txn-late-app",
                                         "producer_id": pid, "producer_epoch": epoch,
                                         "committed": True})
        assert stale["error_code"] == ErrorCode.INVALID_PRODUCER_EPOCH
    finally:
        sock.close()
