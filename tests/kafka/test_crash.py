"""Nothing acknowledged is lost across gateway crashes (issue 47, item 0), checked from
outside with a stock client (confluent-kafka, idempotent, acks=all) against real
gateway processes killed with SIGKILL or stopped with SIGSTOP: every acknowledged
(offset, value) reads back at that offset, no high watermark hides one, no offset is
given twice, and the producer never fails for good.

The gateways here write the LAC to the bookies only 5 s after their last add (the
default is 200 ms), so a gateway killed right after an acknowledgement always leaves
its ledger's LAC one entry short of it: what a reader that trusts that LAC gets wrong.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import (
    BOUND_S,
    AckJournal,
    idempotent_producer,
    produce,
    read_back,
    sees_only,
    verify,
    wait_until,
    watermarks,
)

SLOW_LAC = {"LEDGERD_EXPLICIT_LAC_INTERVAL_MS": "5000",
            "LEDGERD_ZK_TIMEOUT_MS": "3000"}  # a lease of 1.5 s


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(BOUND_S)


def test_a_fresh_gateway_continues_after_the_last_acknowledged_offset(
        zk_chroot: str, tmp_path: Path) -> None:
    """The issue's reproduction: 20 messages acknowledged one at a time, kill -9 of the
    gateway right after the 20th acknowledgement, a fresh gateway asked for the high
    watermark first (as a consumer reconnecting does), then one more message. The
    high watermark was 19 (the dead writer's LAC), and the next message was given
    offset 19, overwriting the acknowledged before-19 in the log's numbering."""
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env=SLOW_LAC)
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        _create(gw.bootstrap, "one", 1)
        journal = AckJournal()
        producer = idempotent_producer(gw.bootstrap, journal)
        produce(producer, journal, "one", [b"before-%d" % i for i in range(20)],
                lambda _i: 0, one_at_a_time=True)
        assert sorted(o for _, o in journal.acked) == list(range(20)), journal.errors
        gw.restart(signal.SIGKILL)
        assert watermarks(gw.bootstrap, "one", 1) == [20]
        produce(producer, journal, "one", [b"after"], lambda _i: 0)
        assert journal.acked.get((0, 20)) == b"after", (journal.acked, journal.errors)
        highs = watermarks(gw.bootstrap, "one", 1)
        assert highs == [21]
        assert verify(journal, highs, read_back(gw.bootstrap, "one", highs)) == []
        assert not journal.errors


def test_a_gateway_stopped_past_its_session_resumes_after_the_other_is_killed(
        zk_chroot: str, tmp_path: Path) -> None:
    """Two gateways share 8 partitions. A is stopped (SIGSTOP) past its ZooKeeper
    session, B takes every partition over and writes on, then B is killed (SIGKILL)
    right after an acknowledgement and A is resumed. A had kept its writers, producer
    sequences and high watermarks from before the stop and answered from them: stale
    high watermarks hid B's messages, offsets were given twice, and the idempotent
    producer died of OUT_OF_ORDER_SEQUENCE_NUMBER. Now A drops all of it with the lost
    session, and rebuilds it from the log when it leads the partitions again."""
    a = GatewayProcess(zk_chroot, tmp_path / "a.log", env=SLOW_LAC)
    b = GatewayProcess(zk_chroot, tmp_path / "b.log", env=SLOW_LAC)
    with running_cluster(tmp_path, zk_chroot, 3, a):
        try:
            b.start()
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            parts = 8
            _create(a.bootstrap, "shared", parts)
            journal = AckJournal()
            producer = idempotent_producer(f"{a.bootstrap},{b.bootstrap}", journal)

            def batch(tag: str, n: int) -> list[bytes]:
                return [b"%s-%d" % (tag.encode(), i) for i in range(n)]

            produce(producer, journal, "shared", batch("both", 160), lambda i: i % parts)
            assert a.process is not None and b.process is not None
            os.kill(a.process.pid, signal.SIGSTOP)
            try:
                wait_until(sees_only(b, b), "a's session expires and b sees it gone")
                produce(producer, journal, "shared", batch("b", 160), lambda i: i % parts)
                produce(producer, journal, "shared", batch("b-last", parts),
                        lambda i: i % parts, one_at_a_time=True)
                b.stop(signal.SIGKILL)  # right after the last acknowledgement
            finally:
                os.kill(a.process.pid, signal.SIGCONT)
            wait_until(sees_only(a, a), "b's session expires and a sees it gone")
            highs = watermarks(a.bootstrap, "shared", parts)
            stale = [(p, hw, journal.highest(p)) for p, hw in enumerate(highs)
                     if hw <= journal.highest(p)]
            assert not stale, f"high watermarks hiding acknowledged offsets: {stale}"
            produce(producer, journal, "shared", batch("a-again", 160), lambda i: i % parts)
            highs = watermarks(a.bootstrap, "shared", parts)
            assert verify(journal, highs, read_back(a.bootstrap, "shared", highs)) == []
            assert len(journal.acked) == 160 * 3 + parts, journal.errors[:10]
        finally:
            if b.running:
                b.stop(signal.SIGKILL)
