"""Compacted topics on a real cluster (ZooKeeper, bookie processes, a ``ledgerd
gateway`` process) with a stock client (confluent-kafka): the cleaner keeps exactly
the latest value of each key at its original offset, tombstones go after
delete.retention.ms, keyless records are refused, a topic written only in
transactions is compacted (aborted records removed, committed ones compacted), and a
gateway killed with SIGKILL while it compacts loses no key's latest acknowledged
value."""

from __future__ import annotations

import os
import random
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import BOUND_S, wait_until

FAST_CLEANER = {"LEDGERD_COMPACTION_BACKOFF_MS": "200",
                "LEDGERD_COMPACTION_ORPHAN_AGE_S": "10"}
VALUE = 20_000  # bytes: about 50 a ledger (log_roll_bytes is 1 MiB in these tests)


def _alter(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in configs.items()])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([res])[res].result(60)


def _create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, config=configs)])[topic].result(
        BOUND_S)


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]],
             ) -> list[tuple[bytes | None, int, Any]]:
    """(key, offset, error) of each record, acks=all, in order."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": int(BOUND_S * 1000)})
    out: list[tuple[bytes | None, int, Any]] = []
    for key, value in records:
        p.produce(topic, value=value, key=key, partition=0,
                  on_delivery=lambda err, msg: out.append((msg.key(), msg.offset(), err)))
        p.poll(0)
    assert p.flush(BOUND_S) == 0
    return out


def _consume(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every (offset, key, value) from the start to the high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{random.random()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "enable.partition.eof": True})
    try:
        _, high = c.get_watermark_offsets(TopicPartition(topic, 0), BOUND_S)
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + BOUND_S
        while not out or out[-1][0] < high - 1:
            assert time.monotonic() < deadline, "consumer did not reach the high watermark"
            msg = c.poll(1.0)
            if msg is None or msg.error():
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        c.close()


def _metric(gw: GatewayProcess, name: str) -> float:
    text = urllib.request.urlopen(gw.metrics_url, timeout=10).read().decode()
    m = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_compacted_topic_keeps_the_latest_value_of_each_key_at_its_offset(
        zk_chroot: str, tmp_path: Path) -> None:
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env=FAST_CLEANER)
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        # no pass until everything is read back once (min.compaction.lag.ms lowered
        # then): the cleaner checks every 200 ms and could clean before the first read
        _create(gw.bootstrap, "kv", {"cleanup.policy": "compact",
                                     "min.cleanable.dirty.ratio": "0.01",
                                     "delete.retention.ms": "3000",
                                     "min.compaction.lag.ms": "3600000"})
        # keyless records are refused, nothing of their batch written
        refused = _produce(gw.bootstrap, "kv", [(None, b"no key")])
        assert refused[0][2] is not None and refused[0][2].code() == 87  # INVALID_RECORD
        # 20 keys x 8 rounds over several ledgers, then tombstones for keys 0-4, then
        # filler under one key so that all of it is in closed ledgers
        rounds = [(b"k%02d" % k, b"%02d:%d:" % (k, r) + b"x" * VALUE)
                  for r in range(8) for k in range(20)]
        tombstones: list[tuple[bytes | None, bytes | None]] = [
            (b"k%02d" % k, None) for k in range(5)]
        filler = [(b"filler", b"f%d:" % i + b"y" * VALUE) for i in range(60)]
        acked = _produce(gw.bootstrap, "kv", rounds + tombstones + filler)
        assert all(err is None for _, _, err in acked), acked
        latest = {key: off for key, off, _ in acked}
        started = time.monotonic()
        before = _consume(gw.bootstrap, "kv")
        assert len(before) == len(acked)
        _alter(gw.bootstrap, "kv", {"min.compaction.lag.ms": "0"})

        def compacted() -> bool:
            got = _consume(gw.bootstrap, "kv")
            keys = [k for _, k, _ in got if k != b"filler"]
            return len(keys) == len(set(keys)) == 15  # one each; tombstones gone
        wait_until(compacted, "the cleaner compacted the topic", bound=120)
        took = time.monotonic() - started
        got = _consume(gw.bootstrap, "kv")
        for offset, key, value in got:
            assert offset == latest[key] or key == b"filler", (offset, key)
            if key != b"filler":
                k = int(key[1:])
                assert value is not None and value.startswith(b"%02d:7:" % k)
        assert {k for _, k, _ in got} == {b"k%02d" % k for k in range(5, 20)} | {b"filler"}
        assert got[-1][0] == latest[b"filler"]  # the last record is never compacted away
        removed = _metric(gw, "ledgerd_kafka_compaction_records_removed")
        b_before = _metric(gw, "ledgerd_kafka_compaction_bytes_before")
        b_after = _metric(gw, "ledgerd_kafka_compaction_bytes_after")
        print(f"compaction: {len(before)} records -> {len(got)} read back, "
              f"{removed:.0f} removed, ledger bytes {b_before:.0f} -> {b_after:.0f}, "
              f"{took:.1f} s from the last produce to the compacted view")
        assert removed >= len(before) - len(got) - 60  # filler in the active ledger stays
        assert b_after < b_before
        # a consumer asking for an offset inside a removed range gets the next kept one
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "inside",
                      "enable.auto.commit": False})
        try:
            c.assign([TopicPartition("kv", 0, 3)])
            deadline = time.monotonic() + BOUND_S
            msg = None
            while msg is None or msg.error():
                assert time.monotonic() < deadline
                msg = c.poll(1.0)
            assert msg.offset() == min(o for o, _, _ in got if o >= 3)
        finally:
            c.close()


def _consume_to_end(bootstrap: str, topic: str, isolation: str,
                    ) -> list[tuple[int, bytes, bytes | None]]:
    """Every (offset, key, value) a consumer with ``isolation`` reads from the start
    until it is told it reached the end (the LSO for read_committed)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{random.random()}",
                  "enable.auto.commit": False, "isolation.level": isolation,
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + BOUND_S
        while True:
            assert time.monotonic() < deadline, f"{isolation}: no end after {out[-3:]}"
            msg = c.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()


def test_a_compacted_topic_written_in_transactions_keeps_the_latest_committed_values(
        zk_chroot: str, tmp_path: Path) -> None:
    """Kafka Streams' changelog with exactly_once_v2: a compacted topic only a
    transactional producer writes. Rounds of values for 10 keys, some rounds aborted
    (the last one too), 3 keys made tombstones in a committed one, then committed filler
    so that all of it is in closed ledgers. After the cleaner ran: a read_committed
    consumer from the start reads exactly each key's latest committed value, a
    read_uncommitted one no aborted or superseded record, every record kept at its
    offset, and the ledgers shrank."""
    from confluent_kafka import Producer

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env=FAST_CLEANER)
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "changelog", {"cleanup.policy": "compact",
                                            "min.cleanable.dirty.ratio": "0.01",
                                            "delete.retention.ms": "3000",
                                            "min.compaction.lag.ms": "3600000"})
        p = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": "streams-app",
                      "linger.ms": 5, "socket.timeout.ms": 6000})
        p.init_transactions(BOUND_S)
        aborted_rounds = {1, 4, 7}
        latest: dict[bytes, bytes | None] = {}
        for r in range(8):
            p.begin_transaction()
            values = {b"k%02d" % k: b"%02d:%d:" % (k, r) + b"x" * VALUE for k in range(10)}
            if r == 6:  # committed tombstones
                values.update({b"k%02d" % k: None for k in range(3)})
            for key, value in values.items():
                p.produce("changelog", key=key, value=value, partition=0)
            if r in aborted_rounds:
                assert p.flush(BOUND_S) == 0  # written to the log, then aborted
                p.abort_transaction(BOUND_S)
            else:
                p.commit_transaction(BOUND_S)
                latest.update(values)
        for t in range(8):  # filler, 8 small transactions: the last ones roll a ledger
            p.begin_transaction()
            for i in range(10):
                p.produce("changelog", key=b"filler",
                          value=b"f%d.%d:" % (t, i) + b"y" * VALUE, partition=0)
            p.commit_transaction(BOUND_S)
        want = {k: v for k, v in latest.items() if v is not None}
        before = _consume_to_end(gw.bootstrap, "changelog", "read_uncommitted")
        committed_before = _consume_to_end(gw.bootstrap, "changelog", "read_committed")
        assert len(before) == 8 * 10 + 80 and len(committed_before) == 5 * 10 + 80
        at = {(k, v): o for o, k, v in before}
        started = time.monotonic()
        _alter(gw.bootstrap, "changelog", {"min.compaction.lag.ms": "0"})

        def keys_of(got: list[tuple[int, bytes, bytes | None]],
                    ) -> list[tuple[bytes, bytes | None]]:
            return [(k, v) for _, k, v in got if k != b"filler"]

        def compacted() -> bool:
            got = keys_of(_consume_to_end(gw.bootstrap, "changelog", "read_uncommitted"))
            return len(got) == len(want) and dict(got) == want
        wait_until(compacted, "the cleaner compacted the transactional topic", bound=120)
        took = time.monotonic() - started
        committed = _consume_to_end(gw.bootstrap, "changelog", "read_committed")
        uncommitted = _consume_to_end(gw.bootstrap, "changelog", "read_uncommitted")
        # exactly each key's latest committed value (rounds 5 and 6; 7 was aborted;
        # k00-k02's tombstones gone after delete.retention.ms), none aborted
        assert len(keys_of(committed)) == len(want) and dict(keys_of(committed)) == want
        assert all(v is not None and v.split(b":")[1] in (b"5", b"6")
                   for _, v in keys_of(committed))
        assert len(keys_of(uncommitted)) == len(want) and dict(keys_of(uncommitted)) == want
        # every record kept is where it was; the filler's last value is there
        for offset, key, value in uncommitted:
            assert at[(key, value)] == offset, (offset, key)
        assert committed[-1] == before[-1]
        removed = _metric(gw, "ledgerd_kafka_compaction_records_removed")
        b_before = _metric(gw, "ledgerd_kafka_compaction_bytes_before")
        b_after = _metric(gw, "ledgerd_kafka_compaction_bytes_after")
        print(f"transactional compaction: {len(before)} records ({len(committed_before)} "
              f"committed) -> {len(uncommitted)} read back, {removed:.0f} removed, "
              f"ledger bytes {b_before:.0f} -> {b_after:.0f}, {took:.1f} s from the "
              "last commit to the compacted view")
        assert b_after < b_before / 2
        assert removed >= 8 * 10 - len(want)


def _touch(bootstrap: str) -> None:
    """Ask for the partition's watermarks (the gateway then has it in use)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "touch"})
    try:
        c.get_watermark_offsets(TopicPartition("crash", 0), 10)
    except Exception:  # the gateway may be dying on purpose already
        pass
    finally:
        c.close()


def _orphans(zk: str) -> int:
    """Replacement ledgers (tagged compacted-for) no log lists."""
    import trio

    import ledgerd
    from ledgerd.errors import NoSuchLedgerError
    from ledgerd.kafka.compaction import COMPACTED_LOG_KEY

    async def count() -> int:
        async with ledgerd.open_client(zk) as client:
            n = 0
            async for lid in client.list_ledgers():
                try:
                    md = await client.ledger_metadata(lid)
                except NoSuchLedgerError:
                    continue  # deleted since it was listed
                name = dict(md.custom_metadata).get(COMPACTED_LOG_KEY)
                if name is not None and lid not in await client.logs.ledgers(name):
                    n += 1
            return n
    return trio.run(count)


def _deferred(zk: str, topic: str) -> list[int]:
    """The ledgers of ``topic``'s partition 0 whose deletion its log's record defers
    and that are still there."""
    import trio

    import ledgerd
    from ledgerd.errors import NoSuchLedgerError
    from ledgerd.kafka.partitions import log_name

    async def still() -> list[int]:
        async with ledgerd.open_client(zk) as client:
            record, _ = await client.logs.store.get(log_name(topic, 0))
            out = []
            for lid, _ in record.deferred:
                try:
                    await client.ledger_metadata(lid)
                except NoSuchLedgerError:
                    continue
                out.append(lid)
            return out
    return trio.run(still)


def _latest(gw: GatewayProcess, transactional: bool) -> dict[bytes, bytes | None]:
    """Each key's last value a consumer from the start reads (read_committed for a
    transactional topic)."""
    read = _consume_to_end(gw.bootstrap, "crash", "read_committed") if transactional \
        else _consume(gw.bootstrap, "crash")
    return {k: v for _, k, v in read}


CRASH_POINTS = ("kafka_compaction.writing", "kafka_compaction.written",
                "kafka_compaction.swapped")


def _produce_txn(bootstrap: str, topic: str, committed: list[tuple[bytes, bytes]],
                 aborted: list[tuple[bytes, bytes]]) -> None:
    """``committed`` in one transaction, then ``aborted`` written and aborted."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "crash-app",
                  "linger.ms": 5, "socket.timeout.ms": 6000})
    p.init_transactions(BOUND_S)
    for records, commit in ((committed, True), (aborted, False)):
        if not records:
            continue
        p.begin_transaction()
        for key, value in records:
            p.produce(topic, key=key, value=value, partition=0)
        if commit:
            p.commit_transaction(BOUND_S)
        else:
            assert p.flush(BOUND_S) == 0
            p.abort_transaction(BOUND_S)


@pytest.mark.parametrize("transactional", [False, True],
                         ids=["idempotent", "transactional"])
def test_kill_9_while_compacting_loses_no_keys_latest_value(
        zk_chroot: str, tmp_path: Path, transactional: bool) -> None:
    """Rounds of new values for 25 keys, each followed by a kill -9 of the gateway:
    at a named step of a pass (``LEDGERD_CRASH_AT``: a replacement half written, all
    written before the swap, swapped before the old ledgers are deleted), or at a
    random moment. After each restart every key's latest acknowledged value reads
    back; at the end the log is compacted, no replacement is left orphaned and every
    replaced ledger is deleted (file.delete.delay.ms, 1 s here, later). The
    transactional variant writes each third of a round in a committed transaction and
    ends the round with an aborted one over every key: read_committed consumers read
    back the latest committed values, and compaction removes aborted records."""
    seed = int(os.environ.get("COMPACTION_CRASH_SEED", random.randrange(1 << 30)))
    print(f"COMPACTION_CRASH_SEED={seed}")
    rng = random.Random(seed)
    idle = {**FAST_CLEANER, "LEDGERD_ZK_TIMEOUT_MS": "3000",
            "LEDGERD_COMPACTION_BACKOFF_MS": "600000"}  # no pass while producing
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env=dict(idle))
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "crash", {"cleanup.policy": "compact",
                                        "min.cleanable.dirty.ratio": "0.01",
                                        "file.delete.delay.ms": "1000"})
        latest: dict[bytes, bytes] = {}
        kills = orphaned = 0
        plan = [p for p in CRASH_POINTS for _ in range(2)] + [None] * 3
        rng.shuffle(plan)
        for round_, point in enumerate(plan):
            # three rounds of values (1.5 MB): a ledger rolls, superseded records in it
            for half in range(3):
                values = [(b"k%02d" % k, b"%d:%d.%d:" % (k, round_, half) + b"x" * VALUE)
                          for k in range(25)]
                if transactional:
                    garbage = [(k, b"aborted:" + v) for k, v in values] if half == 2 else []
                    _produce_txn(gw.bootstrap, "crash", values, garbage)
                else:
                    acked = _produce(gw.bootstrap, "crash", values)  # type: ignore[arg-type]
                    assert all(err is None for _, _, err in acked), acked
                latest.update(values)
            gw.env = {**FAST_CLEANER, "LEDGERD_ZK_TIMEOUT_MS": "3000"}
            if point is not None:  # the next pass kills it at that step
                gw.env["LEDGERD_CRASH_AT"] = point
            gw.restart(signal.SIGKILL)
            _touch(gw.bootstrap)  # the gateway compacts partitions it has served
            if point is None:  # kill -9 at a random moment of the passes
                time.sleep(rng.uniform(0.0, 1.0))
                gw.stop(signal.SIGKILL)
            else:
                wait_until(lambda: not gw.running, f"a pass reached {point}", bound=60)
            kills += 1
            orphaned += _orphans(zk_chroot)  # a pass killed before its swap
            gw.env = dict(idle)
            gw.start()
            if transactional:  # the markers of a transaction may be completed by recovery
                wait_until(lambda: _latest(gw, True) == latest,
                           f"latest committed values after kill {kills} at {point} "
                           f"(seed {seed})", bound=60)
                continue
            read = _consume(gw.bootstrap, "crash")
            got = {k: v for _, k, v in read}
            wrong = {k: (latest[k][:8], got.get(k, b"")[:8]) for k in latest
                     if got.get(k) != latest[k]}
            assert not wrong, (f"after kill {kills} at {point} (seed {seed}): "
                               f"{wrong} (read {len(read)}, last {read[-1][0]})")
        if transactional:  # committed filler: the last aborted records in closed ledgers
            for t in range(6):
                filler = [(b"filler", b"f%d.%d:" % (t, i) + b"y" * VALUE) for i in range(10)]
                _produce_txn(gw.bootstrap, "crash", filler, [])
                latest.update(filler)
        gw.env = {**FAST_CLEANER, "LEDGERD_ZK_TIMEOUT_MS": "3000"}
        gw.restart()
        _touch(gw.bootstrap)

        def compacted() -> bool:
            if transactional:  # and no aborted record is left (read_uncommitted)
                every = _consume_to_end(gw.bootstrap, "crash", "read_uncommitted")
                if any(v is not None and v.startswith(b"aborted:") for _, _, v in every):
                    return False
                got = _consume_to_end(gw.bootstrap, "crash", "read_committed")
            else:
                got = _consume(gw.bootstrap, "crash")
            return len(got) < 25 * 3 * len(plan) and {k: v for _, k, v in got} == latest
        wait_until(compacted, "the restarted gateway compacts", bound=120)
        # replacements a killed pass never listed are reclaimed once 10 s old
        wait_until(lambda: _orphans(zk_chroot) == 0, "orphaned replacements deleted",
                   bound=90)
        # sweeps that see the last pass's replacements 10 s old delete none of them
        wait_until(lambda: _metric(gw, "ledgerd_kafka_compaction_sweeps") >= 3,
                   "three sweeps for orphans", bound=60)
        assert _latest(gw, transactional) == latest
        # the replaced ledgers, swapped by passes killed before or after, are deleted
        # once due by whichever gateway writes the partition (the record keeps them)
        wait_until(lambda: not _deferred(zk_chroot, "crash"),
                   "replaced ledgers deleted once due", bound=60)
        log_text = gw.log_path.read_text(errors="replace")
        print(f"{kills} kills, every key's latest value read back after each; "
              f"{log_text.count('kafka_compaction_pass')} passes and "
              f"{log_text.count('log_ledgers_replaced')} swaps logged, {orphaned} "
              "orphaned replacements counted after the kills (all reclaimed)")


def _ledger_count(zk: str, topic: str) -> int:
    import trio

    import ledgerd
    from ledgerd.kafka.partitions import log_name

    async def count() -> int:
        async with ledgerd.open_client(zk) as client:
            return len(await client.logs.ledgers(log_name(topic, 0)))

    return trio.run(count)


def test_a_topics_segment_bytes_rolls_its_ledgers_and_fetches_see_the_compaction(
        zk_chroot: str, tmp_path: Path) -> None:
    """segment.bytes below the gateway's log_roll_bytes rolls the partition's ledger
    (``TopicPolicy.rolling``, set on the writer before each append), so a compacted
    topic's records are compacted that much sooner; and a fetch then reads the
    compacted records, not the batches the gateway kept of its recent appends (a cache
    large enough here to hold them all)."""
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env={
        **FAST_CLEANER, "LEDGERD_LOG_ROLL_BYTES": str(64 << 20),
        "LEDGERD_TAIL_CACHE_BYTES": str(16 << 20)})
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "sized", {"cleanup.policy": "compact",
                                        "min.cleanable.dirty.ratio": "0.01",
                                        "segment.bytes": str(1 << 20)})
        acked = _produce(gw.bootstrap, "sized", [(b"k", b"v%d" % i) for i in range(5)])
        # 1.2 MiB more under another key: the ledger passes 1 MiB and rolls
        acked += _produce(gw.bootstrap, "sized",
                          [(b"filler", b"f%d:" % i + b"y" * 100_000) for i in range(12)])
        acked += _produce(gw.bootstrap, "sized", [(b"last", b"x")])
        assert _ledger_count(zk_chroot, "sized") >= 2

        def compacted() -> bool:
            return [(k, v) for _, k, v in _consume(gw.bootstrap, "sized")
                    if k == b"k"] == [(b"k", b"v4")]
        wait_until(compacted, "a fetch read the compacted ledger", bound=60)
        got = _consume(gw.bootstrap, "sized")
        assert got[0][0] == acked[4][1]  # the offset it was written at
        assert got[-1][0] == acked[-1][1]


def test_a_consumer_reads_past_ledgers_compaction_emptied_without_errors(
        zk_chroot: str, tmp_path: Path) -> None:
    """A ledger rolled every 100 ms under three keys is emptied by compaction but for
    its batches' headers. A fetch that yields no record makes librdkafka double the
    partition's fetch size, and past 1 GiB (ten such fetches) report
    MSG_SIZE_TOO_LARGE for each (found by an outside audit: 91 errors in one read
    from the start); a fetch reads on past emptied batches, so a reader from offset 0
    gets each key's latest value and no error."""
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env=FAST_CLEANER)
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "emptied", {"cleanup.policy": "compact", "segment.ms": "100",
                                          "min.cleanable.dirty.ratio": "0.01"})
        p = Producer({"bootstrap.servers": gw.bootstrap, "linger.ms": 0,
                      "message.timeout.ms": int(BOUND_S * 1000)})
        acked: dict[bytes, tuple[int, bytes]] = {}

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            acked[msg.key()] = (msg.offset(), msg.value())

        started, i = time.monotonic(), 0
        while time.monotonic() - started < 6:  # about 60 ledgers, a roll every 100 ms
            p.produce("emptied", key=b"k%d" % (i % 3), value=b"v%d" % i, partition=0,
                      on_delivery=delivered)
            assert p.flush(BOUND_S) == 0  # one at a time: paced by the acknowledgements
            i += 1
        wait_until(lambda: _metric(gw, "ledgerd_kafka_compaction_records_removed") > i * 0.8,
                   "the cleaner emptied the closed ledgers", bound=120)
        c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "emptied",
                      "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            _, high = c.get_watermark_offsets(TopicPartition("emptied", 0), BOUND_S)
            c.assign([TopicPartition("emptied", 0, 0)])
            got: dict[bytes, tuple[int, bytes]] = {}
            errors: list[str] = []
            deadline = time.monotonic() + BOUND_S
            while time.monotonic() < deadline:
                msg = c.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        break
                    errors.append(msg.error().str())
                    continue
                got[msg.key()] = (msg.offset(), msg.value())
            assert errors == [], f"{len(errors)} errors, first {errors[:2]} ({i} produced)"
            assert got == acked and max(o for o, _ in got.values()) == high - 1
        finally:
            c.close()
