"""The Kafka gateway's state in a metadata snapshot (issue 49): topics, groups and their
committed offsets are exported with everything else, and a restore gives them back node
for node, at the same versions (restored under another root of the same ZooKeeper, so
the running gateway is left alone)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.kafka.conftest import KafkaCluster

BOUND_S = 120


def kcat(cluster: KafkaCluster, *args: str, stdin: str = "") -> str:
    done = subprocess.run(["kcat", "-b", cluster.bootstrap, *args], input=stdin.encode(),
                          capture_output=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def shell(zk: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk,
                           *args], capture_output=True, text=True, timeout=BOUND_S)


def test_topics_groups_and_offsets_are_in_the_snapshot_and_restore_node_for_node(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    kcat(kafka_cluster, "-P", "-t", "dr-topic", stdin="".join(f"m{i}\n" for i in range(10)))
    got = kcat(kafka_cluster, "-G", "dr-group", "-X", "auto.offset.reset=earliest", "-e",
               "dr-topic")
    assert got.split() == [f"m{i}" for i in range(10)]
    snap = tmp_path / "kafka.snap"
    done = shell(kafka_cluster.zk, "metadata", "snapshot", str(snap), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["summary"]
    assert summary["kafka_topics"] >= 1 and summary["kafka_groups"] >= 1, summary
    assert summary["cursors"] >= 1, summary  # the group's committed offsets
    doc = json.loads(snap.read_text())
    paths = {n["path"] for n in doc["nodes"]}
    assert "kafka/topics/dr-topic" in paths and "kafka/groups/dr-group" in paths, paths

    done = shell(kafka_cluster.zk, "--zk-root", "/restored", "metadata", "restore",
                 str(snap))
    assert done.returncode == 0, done.stdout + done.stderr
    done = shell(kafka_cluster.zk, "--zk-root", "/restored", "metadata", "diff", str(snap),
                 "--json")
    assert done.returncode == 0, done.stderr
    diff = json.loads(done.stdout)
    # node for node, but for the mark that every group offset is indexed, which a
    # restore leaves out on purpose (gateways index the restored offsets again)
    only = [n if isinstance(n, str) else n["path"] for n in diff["only_snapshot"]]
    assert only == ["kafka/offset_index_complete"], diff
    assert not diff["changed"] and not diff["only_live"] and not diff["version_only"], diff


def test_a_gateway_does_not_recreate_a_lost_root_and_serves_again_after_a_restore(
        zk_chroot: str, tmp_path: Path) -> None:
    """The cluster's root deleted under a running gateway: it stops serving and logs
    that the metadata is missing (once), but never writes its registration back, which
    would recreate a root the operator must restore into empty; after the restore it
    registers again and the data produced before the loss is read back."""
    import time

    from kazoo.client import KazooClient

    from tests.kafka.conftest import GatewayProcess, running_cluster

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw) as cluster:
        kcat(cluster, "-P", "-t", "lost", stdin="".join(f"m{i}\n" for i in range(5)))
        snap = tmp_path / "lost.snap"
        done = shell(zk_chroot, "metadata", "snapshot", str(snap))
        assert done.returncode == 0, done.stderr
        hosts, chroot = zk_chroot.split("/", 1)
        zk = KazooClient(hosts=hosts, timeout=10)
        zk.start(timeout=30)
        try:
            from kazoo.exceptions import NotEmptyError

            for _ in range(20):  # a recursive delete is not atomic: a node made under
                try:            # the root while it runs (a bookie, the gateway) fails it
                    zk.delete(f"/{chroot}/ledgers", recursive=True)
                    break
                except NotEmptyError:
                    continue
            else:
                raise AssertionError("the root could not be deleted in 20 tries")

            def wait_log(line: str, after: int) -> None:
                deadline = time.monotonic() + BOUND_S
                while line not in gw.log_path.read_text(errors="replace")[after:]:
                    assert time.monotonic() < deadline, f"no {line}:\n{gw.log_text()}"
                    time.sleep(0.1)

            wait_log("cluster_metadata_missing", 0)
            # a negative: watched over three more membership refreshes (one a second)
            watch_until = time.monotonic() + 3.0
            while time.monotonic() < watch_until:
                assert zk.exists(f"/{chroot}/ledgers") is None, "the gateway wrote the root"
                time.sleep(0.1)
        finally:
            zk.stop()
        done = shell(zk_chroot, "metadata", "restore", str(snap))
        assert done.returncode == 0, done.stderr
        wait_log("cluster_metadata_back", 0)
        kcat(cluster, "-P", "-t", "lost", stdin="after\n")
        got = kcat(cluster, "-C", "-t", "lost", "-o", "beginning", "-e")
        assert got.split() == [f"m{i}" for i in range(5)] + ["after"]


def test_a_topic_comes_back_from_its_ledgers_headers_without_a_snapshot(
        zk_chroot: str, tmp_path: Path) -> None:
    """Issue 49 without a snapshot: a topic produced to by a stock client (acks=all),
    its gateway killed, the root deleted, ``metadata rebuild --apply`` from the bookies
    alone: the topic record (partitions, id, configs) and its partition logs come back
    from the ledgers' log headers, and a restarted gateway serves every acknowledged
    message at its original offset (group offsets are lost, as documented)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from kazoo.client import KazooClient

    from ledgerd.metadata.kafka_topics import TopicRecord
    from ledgerd.metadata.logs import LogRecord
    from tests.kafka.conftest import GatewayProcess, running_cluster

    secret = tmp_path / "cluster.secret"
    secret.write_text("s" * 64)
    secret.chmod(0o600)
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    hosts, chroot = zk_chroot.split("/", 1)
    root = f"/{chroot}/ledgers"
    topic = "dr.headers"
    with running_cluster(tmp_path, zk_chroot, 3, gw,
                         {"cluster_secret_file": str(secret), "gc_wait_time_ms": 1000}
                         ) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1,
                                      config={"retention.ms": "86400000"})]
                            )[topic].result(BOUND_S)
        acked: dict[tuple[int, int], bytes] = {}

        def produce(first: int, n: int, size: int) -> None:
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                                 "linger.ms": 5})

            def done(err: object, msg: object) -> None:
                assert err is None, err
                acked[(msg.partition(), msg.offset())] = msg.value()  # type: ignore[attr-defined]
            for i in range(first, first + n):
                producer.produce(topic, value=b"%05d" % i + bytes(size), partition=i % 3,
                                 on_delivery=done)
            assert producer.flush(BOUND_S) == 0

        # 1.2 MB a partition: each log rolls past its first 1 MiB ledger (every ledger
        # with its header); then a second writer per partition (the epoch goes on)
        produce(0, 150, 24_000)
        cluster.gateway.restart()
        produce(150, 150, 500)
        assert len(acked) == 300
        zk = KazooClient(hosts=hosts, timeout=10)
        zk.start(timeout=30)
        try:
            before = TopicRecord.from_json(zk.get(f"{root}/kafka/topics/{topic}")[0], topic)
            assert before.topic_id and before.configs == {"retention.ms": "86400000"}
            logs = {p: LogRecord.from_json(zk.get(f"{root}/logs/kafka.{topic}.{p}")[0], "")
                    for p in range(3)}
            assert all(len(r.ledgers) >= 3 for r in logs.values()), logs  # rolled
            cluster.gateway.stop(signal.SIGKILL)  # its ledgers left open
            zk.delete(f"{root}/LAYOUT")  # first: every bookie's GC stops at once
            zk.delete(root, recursive=True)
        finally:
            zk.stop()

        named = ",".join(b.address for b in cluster.bookies)
        done = shell(zk_chroot, "metadata", "rebuild", "--bookies", named)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"kafka topic {topic}: 3 partition(s), id {before.topic_id}, configs " \
               "retention.ms=86400000" in done.stdout, done.stdout
        done = shell(zk_chroot, "metadata", "rebuild", "--bookies", named, "--apply",
                     "--secret-file", str(secret), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        doc = json.loads(done.stdout)
        assert [t["name"] for t in doc["kafka_topics"]] == [topic], doc["kafka_topics"]
        (tmp_path / "rebuild.json").write_text(done.stdout)
        assert not any(v.startswith("not closed") for v in doc["closed"].values()), doc
        # every ledger of every partition log written back, closed where it ended
        assert {lid for r in logs.values() for lid in r.ledgers} <= {
            int(k) for k in doc["closed"]}, doc
        zk = KazooClient(hosts=hosts, timeout=10)
        zk.start(timeout=30)
        try:
            after = TopicRecord.from_json(zk.get(f"{root}/kafka/topics/{topic}")[0], topic)
            assert after == before
            for p in range(3):
                got = LogRecord.from_json(zk.get(f"{root}/logs/kafka.{topic}.{p}")[0], "")
                assert (got.ledgers, got.writers) == (logs[p].ledgers, logs[p].writers)
        finally:
            zk.stop()

        cluster.gateway.start()
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "dr-h",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + BOUND_S
        while len(got) < len(acked) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got[(m.partition(), m.offset())] = m.value()
        consumer.close()
        assert got == acked
        produce(300, 3, 10)  # and it writes on after them
        assert len(acked) == 303 and max(o for p, o in acked if p == 0) == 100
