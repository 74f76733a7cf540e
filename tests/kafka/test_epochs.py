"""Leader epochs (KIP-101/KIP-320): the pure rules (``epochs.py``), a partition's epoch
on real bookies and ZooKeeper (durable, one more per writer, stamped into its batches,
OffsetForLeaderEpoch's answers after leader changes), and real clients across a
gateway's death: a consumer whose position is validated against the new leader's epoch
goes on without loss and without OFFSET_OUT_OF_RANGE, librdkafka negotiating the new
protocol versions."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ledgerd
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.epochs import (
    check_current_epoch,
    current_epoch,
    end_offset_for_epoch,
    epoch_at,
    epoch_history,
)
from ledgerd.kafka.partitions import PartitionLog, PartitionSettings
from ledgerd.kafka.records import BatchHeader, split_batches
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot, start_bookies
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import sees_only, wait_until
from tests.kafka.test_faults import _recv, _request
from tests.kafka.test_protocol import _batch

SETTINGS = PartitionSettings(3, 2, 2, 1 << 20, 1 << 20, 1 << 20)
FENCED, UNKNOWN = ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH


# -- the pure rules ----------------------------------------------------------------------

def test_a_clients_epoch_is_fenced_when_older_and_unknown_when_newer() -> None:
    assert [current_epoch(w) for w in (0, 1, 2)] == [1, 1, 2]
    assert [check_current_epoch(c, 5) for c in (-1, 4, 5, 6)] == [
        ErrorCode.NONE, FENCED, ErrorCode.NONE, UNKNOWN]


def test_the_history_keeps_each_epochs_first_offset_and_adds_the_current_one() -> None:
    # ledgers: two of epoch 1 (a roll), one written before epochs (-1), an empty epoch
    # 3 leaves no ledger with a batch, epoch 4 starts at 30; the writer is at epoch 5
    starts = [(-1, 0), (1, 5), (1, 12), (2, 20), (4, 30)]
    assert epoch_history(starts, 5, 42) == [(1, 5), (2, 20), (4, 30), (5, 42)]
    assert epoch_history(starts, 4, 42) == [(1, 5), (2, 20), (4, 30)]
    assert epoch_history([], 0, 0) == [(0, 0)]


def test_end_offsets_answer_as_kafkas_leader_epoch_cache() -> None:
    history = [(1, 5), (2, 20), (4, 30), (5, 42)]

    def ask(epoch: int) -> tuple[int, int]:
        return end_offset_for_epoch(history, 5, 50, epoch)

    assert ask(5) == (5, 50)  # the current epoch: the log end
    assert ask(4) == (4, 42)  # ended where epoch 5 began
    assert ask(3) == (2, 30)  # no batch of 3: the largest epoch below, up to epoch 4
    assert ask(2) == (2, 30)
    assert ask(1) == (1, 20)
    assert ask(0) == (0, 5)  # older than all known: the epoch asked, the first start
    assert ask(6) == (-1, -1)  # newer than the leader's
    assert ask(-1) == (-1, -1)
    assert [epoch_at(history, o) for o in (0, 5, 19, 20, 41, 42, 99)] == [
        -1, 1, 1, 2, 4, 5, 5]


# -- a partition's epoch on a real cluster -----------------------------------------------

def _split(raw: bytes) -> list[tuple[BatchHeader, bytes]]:
    return split_batches(raw, max_batch_bytes=1 << 20)


def test_a_log_record_keeps_its_writer_count() -> None:
    from ledgerd.metadata.errors import CorruptMetadataError
    from ledgerd.metadata.logs import LogRecord

    record = LogRecord(ledgers=(3, 4), writers=2)
    assert LogRecord.from_json(record.to_json(), "/l") == record
    assert LogRecord.from_json(b'{"format": 1, "ledgers": [3]}', "/l").writers == 0  # old
    for bad in (b'-1', b'"2"', b'true'):
        with pytest.raises(CorruptMetadataError):
            LogRecord.from_json(b'{"format": 1, "ledgers": [], "writers": %s}' % bad, "/l")


async def test_writers_count_opens_not_rolls(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("counted", 3, 2, 2, roll_entries=2)
        for i in range(5):
            await writer.append(b"e%d" % i)
        record, _ = await client.logs.store.get("counted")
        assert len(record.ledgers) >= 3 and record.writers == writer.epoch == 1  # rolled
        again = await client.logs.open_writer("counted", 3, 2, 2)
        assert again.epoch == 2 and (await client.logs.store.get("counted"))[0].writers == 2
        await again.close()


async def test_each_writer_takes_a_new_durable_epoch_and_stamps_its_batches(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """Three writers in turn (a gateway, another, the first again as after a lost
    session): epochs 1, 2, 3, read alike by a reader that never wrote; each batch
    carries its writer's epoch; OffsetForLeaderEpoch answers from the ledgers."""
    import trio

    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:

        async def produce(part: PartitionLog, n: int) -> int:
            item = part.enqueue(_split(_batch(n)), nursery)
            await item.done.wait()
            assert item.error is None and not item.code
            return item.base_offset

        reader = PartitionLog(cb, "ep", 0, SETTINGS, nursery)
        assert await reader.leader_epoch() == 1  # never written: its first writer's
        a = PartitionLog(ca, "ep", 0, SETTINGS, nursery)
        assert await produce(a, 3) == 0
        assert a.writer is not None and a.writer.epoch == 1
        b = PartitionLog(cb, "ep", 0, SETTINGS, nursery)  # another gateway takes over
        assert await produce(b, 4) == 3
        assert b.writer is not None and b.writer.epoch == 2
        await produce(b, 2)  # offsets 7-8, still epoch 2
        a.drop_leadership()  # the first gateway again, as after its session was lost
        assert await produce(a, 1) == 9
        assert a.writer is not None and a.writer.epoch == 3
        assert await reader.leader_epoch(fresh=True) == 3  # durable: in the log record
        records, _ = await a.read(0, 1 << 20)  # the writer's reads reach its last batch
        epochs = [h.leader_epoch for h, _ in _split(records)]
        for at in (3, 7, 9):
            records, _ = await a.read(at, 1 << 20)
            epochs += [h.leader_epoch for h, _ in _split(records)][:1]
        assert epochs == [1, 2, 2, 3]
        assert await a.end_offset_for_epoch(1) == (1, 3)
        assert await a.end_offset_for_epoch(2) == (2, 9)
        assert await a.end_offset_for_epoch(3) == (3, 10)  # the current: the log end
        assert await a.end_offset_for_epoch(0) == (0, 0)
        assert await a.end_offset_for_epoch(4) == (-1, -1)
        assert [await a.epoch_of(o) for o in (0, 2, 3, 8, 9)] == [1, 1, 2, 2, 3]
        nursery.cancel_scope.cancel()


async def test_a_leaders_recovery_waits_for_the_writer_it_is_opening(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """A high watermark asked of the leader while its writer is being opened (the new
    ledger already on the log's list) waits for that writer instead of recovering the
    log's tail, which would fence the new ledger (and make the next append open another
    writer, at another epoch)."""
    import trio

    async def leads() -> bool:
        return True

    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as client, trio.open_nursery() as nursery:
        part = PartitionLog(client, "race", 0, SETTINGS, nursery, authority=leads)
        reached, gate = trio.Event(), trio.Event()
        rebuild = part._rebuild_producers

        async def held(skip: int) -> None:  # the writer's ledger is listed by now
            reached.set()
            await gate.wait()
            await rebuild(skip)

        part._rebuild_producers = held  # type: ignore[method-assign]
        nursery.start_soon(part.open_writer)
        with trio.fail_after(30):
            await reached.wait()
        hws: list[int] = []

        async def ask() -> None:
            hws.append(await part.high_watermark())

        nursery.start_soon(ask)
        with trio.fail_after(10):  # it waits on the opening writer, not on the bookies
            while part._opening.statistics().tasks_waiting == 0:
                await trio.sleep(0.01)
        gate.set()
        with trio.fail_after(30):
            while not hws:
                await trio.sleep(0.01)
        assert hws == [0] and part.writer is not None and part.writer.epoch == 1
        item = part.enqueue(_split(_batch(2)), nursery)
        await item.done.wait()
        assert item.error is None and item.base_offset == 0
        assert part.writer is not None and part.writer.epoch == 1  # not fenced
        nursery.cancel_scope.cancel()


async def test_a_topic_without_an_id_gets_one_that_every_gateway_agrees_on(
        zk_chroot: str) -> None:
    """A topic record from before topic ids gets one when first asked: two gateways
    asking at once (compare-and-set) get the same, kept in the record."""
    import trio

    from ledgerd.kafka.topics import TopicCache
    from ledgerd.metadata.kafka_topics import TopicRecord, TopicStore
    from tests.cluster import metadata_store

    async with metadata_store(zk_chroot) as s1, metadata_store(zk_chroot) as s2:
        await s1.create("/k/topics/old", b'{"format": 1, "partitions": 2}',
                        make_parents=True)
        ids: list[bytes | None] = []

        async def ask(store: object) -> None:
            ids.append(await TopicCache(TopicStore(store, "/k")).topic_id("old"))  # type: ignore[arg-type]

        async with trio.open_nursery() as nursery:
            for store in (s1, s2, s1):
                nursery.start_soon(ask, store)
        assert len(set(ids)) == 1 and ids[0] is not None and len(ids[0]) == 16
        raw, _ = await s2.get("/k/topics/old")
        record = TopicRecord.from_json(raw, "/k/topics/old")
        assert bytes.fromhex(record.topic_id) == ids[0] and record.partitions == 2
        assert await TopicCache(TopicStore(s2, "/k")).topic_id("missing") is None


# -- real clients, two gateways -----------------------------------------------------------

@pytest.fixture
def two_gateways(zookeeper: ZooKeeperServer, tmp_path: Path,
                 ) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with fresh_chroot(zookeeper, "epochs") as zk:
        env = {"LEDGERD_ZK_TIMEOUT_MS": "4000"}
        a = GatewayProcess(zk, tmp_path / "a.log", env=env)
        with running_cluster(tmp_path, zk, 4, a):
            b = GatewayProcess(zk, tmp_path / "b.log", env=env)
            b.start()
            # until both see both, each may answer Metadata as a partition's leader
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            try:
                yield a, b
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)


def _ask(gateway: GatewayProcess, api: ApiKey, version: int,
         body: dict[str, object]) -> dict[str, object]:
    from ledgerd.kafka.api import RESPONSES
    from ledgerd.kafka.schema import Reader, decode

    host, port = gateway.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_request(api, version, body))
        size = int.from_bytes(_recv(sock, 4), "big")
        data = _recv(sock, size)
    r = Reader(data, 4)
    if RESPONSES[api].is_flexible(version):
        r.skip_tags("response header")
    return decode(RESPONSES[api], version, r)


def _leader(gateways: list[GatewayProcess], topic: str) -> tuple[int, int, bytes]:
    """(leader node, leader epoch, topic id) of partition 0, by Metadata v12."""
    reply = _ask(gateways[0], ApiKey.METADATA, 12, {
        "topics": [{"name": topic}], "allow_auto_topic_creation": False})
    t = reply["topics"][0]  # type: ignore[index]
    p = t["partitions"][0]
    return p["leader_id"], p["leader_epoch"], t["topic_id"]


def _wait(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_consumer_position_is_validated_across_two_leader_changes(
        two_gateways: tuple[GatewayProcess, GatewayProcess], tmp_path: Path) -> None:
    """The gateway leading a partition is killed while a consumer reads it: the other
    takes over at a higher epoch (the same in every gateway's Metadata), the consumer
    validates its position there (OffsetForLeaderEpoch) and reads on with nothing lost,
    nothing twice and no OFFSET_OUT_OF_RANGE; then the first gateway comes back and
    leads again at a third epoch. OffsetForLeaderEpoch, asked by raw requests, names
    where each epoch ended."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    a, b = two_gateways
    both = f"{a.bootstrap},{b.bootstrap}"
    admin = AdminClient({"bootstrap.servers": both})
    admin.create_topics([NewTopic("epochs", num_partitions=1)])["epochs"].result(60)
    gateways = {a.node_id: a, b.node_id: b}
    producer = Producer({"bootstrap.servers": both, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True, "retry.backoff.ms": 100,
                         "message.timeout.ms": 90000})
    seen_logs: list[str] = []
    # assigned, not subscribed: the position lives in the consumer across the leader
    # changes (no rebalance, no committed offset to fall back on)
    consumer = Consumer({"bootstrap.servers": both, "group.id": "epochs-g",
                         "auto.offset.reset": "latest", "enable.auto.commit": False,
                         "topic.metadata.refresh.interval.ms": 1000,
                         "debug": "protocol,fetch", "log_level": 7,
                         "logger": _Logger(seen_logs)})
    consumer.assign([TopicPartition("epochs", 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    errors: list[str] = []

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            producer.produce("epochs", b"m%d" % i)
        assert producer.flush(90) == 0

    def consume(n: int) -> None:
        deadline = time.monotonic() + 90
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(str(m.error()))
                continue
            got.append(m.value())

    send(0, 200)
    consume(200)
    leader, epoch1, _ = _leader(list(gateways.values()), "epochs")
    assert epoch1 == 1
    first = gateways[leader]
    other = b if first is a else a
    first.stop(signal.SIGKILL)  # the leader dies; the other takes the partition
    _wait("the other gateway to lead", lambda: _leader([other], "epochs")[0] == other.node_id)
    send(200, 400)
    _wait("the epoch to grow", lambda: _leader([other], "epochs")[1] > epoch1)
    epoch2 = _leader([other], "epochs")[1]
    consume(400)
    first.start()  # back: it leads the partition again (rendezvous hashing)
    _wait("the first gateway to lead again",
          lambda: _leader([other], "epochs")[0] == leader)
    send(400, 600)
    _wait("a third epoch", lambda: _leader([first], "epochs")[1] > epoch2)
    epoch3 = _leader([first], "epochs")[1]
    assert _leader([other], "epochs")[1] == epoch3  # every gateway answers the same
    consume(600)
    consumer.commit(asynchronous=False)  # OffsetCommit v9 carries the record's epoch
    committed = consumer.committed([TopicPartition("epochs", 0)], timeout=30)[0]
    assert (committed.offset, committed.leader_epoch) == (600, epoch3)
    consumer.close()
    (tmp_path / "consumer.log").write_text("\n".join(seen_logs))
    assert got == [b"m%d" % i for i in range(600)]  # in order, none lost or twice
    assert not [e for e in errors if "OUT_OF_RANGE" in e], errors

    # the negotiated versions (librdkafka's protocol debug) and a validation it ran
    text = "\n".join(seen_logs)
    assert "Sent OffsetForLeaderEpochRequest (v2" in text
    assert "validation succeeded: broker end offset 200 (offset leader epoch 1)" in text
    for api, version in (("Fetch", 16), ("Metadata", 13), ("ListOffsets", 7),
                         ("OffsetCommit", 9)):
        assert f"{api}Request (v{version}" in text, (api, version)

    # raw OffsetForLeaderEpoch v4 (flexible) to the leader after two leader changes
    tid = _leader([a], "epochs")[2]
    assert tid != bytes(16)
    leader_gw = gateways[leader]
    reply = _ask(leader_gw, ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, {"topics": [
        {"topic": "epochs", "partitions": [
            {"partition": 0, "current_leader_epoch": epoch3, "leader_epoch": e}
            for e in (1, epoch2, epoch3, epoch3 + 1)]}]})
    parts = reply["topics"][0]["partitions"]  # type: ignore[index]
    answers = [(p["error_code"], p["leader_epoch"], p["end_offset"]) for p in parts]
    assert answers == [(0, 1, 200), (0, epoch2, 400), (0, epoch3, 600), (0, -1, -1)]
    stale = _ask(leader_gw, ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, {"topics": [
        {"topic": "epochs", "partitions": [
            {"partition": 0, "current_leader_epoch": e, "leader_epoch": 1}
            for e in (epoch2, epoch3 + 1)]}, {"topic": "nope", "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 1}]}]})
    codes = [p["error_code"] for t in stale["topics"] for p in t["partitions"]]  # type: ignore[index, union-attr]
    assert codes == [FENCED, UNKNOWN, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    not_leader = _ask(other, ApiKey.OFFSET_FOR_LEADER_EPOCH, 3, {"replica_id": -1, "topics": [
        {"topic": "epochs", "partitions": [
            {"partition": 0, "current_leader_epoch": epoch3, "leader_epoch": 1}]}]})
    assert not_leader["topics"][0]["partitions"][0]["error_code"] == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER  # type: ignore[index]

    # Fetch v13 by topic id, and v12 with a stale epoch; ListOffsets v7 with epochs
    fetch = {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
             "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
             "rack_id": ""}
    by_id = _ask(leader_gw, ApiKey.FETCH, 16, {**fetch, "topics": [
        {"topic_id": tid, "partitions": [{"partition": 0, "current_leader_epoch": epoch3,
                                          "fetch_offset": 590, "partition_max_bytes": 1 << 20}]},
        {"topic_id": b"\x07" * 16, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]}]})
    ok, unknown = by_id["responses"]  # type: ignore[misc]
    assert ok["topic_id"] == tid and ok["partitions"][0]["error_code"] == 0
    assert ok["partitions"][0]["high_watermark"] == 600
    assert [h.leader_epoch for h, _ in _split(ok["partitions"][0]["records"])][-1] == epoch3
    assert unknown["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_ID
    old = _ask(leader_gw, ApiKey.FETCH, 12, {**fetch, "topics": [
        {"topic": "epochs", "partitions": [{"partition": 0, "current_leader_epoch": epoch2,
                                            "fetch_offset": 0, "partition_max_bytes": 100}]}]})
    assert old["responses"][0]["partitions"][0]["error_code"] == FENCED  # type: ignore[index]
    offsets = _ask(leader_gw, ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": "epochs", "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}
            for ts in (-2, -1, -3)]}]})
    found = [(p["offset"], p["leader_epoch"])
             for p in offsets["topics"][0]["partitions"]]  # type: ignore[index]
    assert found[:2] == [(0, 1), (600, epoch3)]
    assert found[2][1] in (1, epoch2, epoch3) and 0 <= found[2][0] < 600  # the newest
    sentinels = _ask(leader_gw, ApiKey.LIST_OFFSETS, 10, {"replica_id": -1, "timeout_ms": 500,
                                                          "topics": [
        {"name": "epochs", "partitions": [
            {"partition_index": 0, "current_leader_epoch": epoch3, "timestamp": ts}
            for ts in (-4, -5)]}]})
    assert [(p["error_code"], p["offset"]) for p in sentinels["topics"][0]["partitions"]] \
        == [(0, 0), (0, -1)]  # type: ignore[index]  # nothing tiered: the log start; none
    too_new = _ask(leader_gw, ApiKey.LIST_OFFSETS, 6, {"replica_id": -1, "topics": [
        {"name": "epochs", "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -3}]}]})
    assert too_new["topics"][0]["partitions"][0]["error_code"] == \
        ErrorCode.UNSUPPORTED_VERSION  # type: ignore[index]

    # DescribeCluster: both gateways, as Metadata lists them, at every version
    cluster = admin.describe_cluster(request_timeout=30).result(60)
    assert cluster.cluster_id == "ledgerd"
    assert sorted((n.id, n.port) for n in cluster.nodes) == sorted(
        (g.node_id, g.port) for g in (a, b))
    for version in (0, 1, 2):
        described = _ask(other, ApiKey.DESCRIBE_CLUSTER, version, {
            "include_cluster_authorized_operations": False, "endpoint_type": 1,
            "include_fenced_brokers": True})
        assert described["error_code"] == 0 and described["cluster_id"] == "ledgerd"
        assert sorted(br["broker_id"] for br in described["brokers"]) == sorted(  # type: ignore[union-attr]
            (a.node_id, b.node_id))
    controllers = _ask(other, ApiKey.DESCRIBE_CLUSTER, 1, {
        "include_cluster_authorized_operations": False, "endpoint_type": 2})
    assert controllers["error_code"] == ErrorCode.MISMATCHED_ENDPOINT_TYPE


class _Logger:
    """A ``logging.Logger`` stand-in for librdkafka's ``logger``: keeps the lines."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def log(self, level: int, fmt: str, *args: object) -> None:
        self.lines.append(fmt % args if args else fmt)
        if len(self.lines) > 200_000:  # bounded: the oldest protocol lines go
            del self.lines[:100_000]
