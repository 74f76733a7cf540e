"""Fetch from follower (KIP-392) against real gateways, bookies and ZooKeeper: two
gateways in two racks with rack-aware reads; the leader of a partition sends a consumer
of the other rack to the gateway there (preferred read replica, no records), which
serves the records; Metadata and DescribeCluster tell the racks; and a stock client
(confluent-kafka with client.rack) reads everything it was sent through its own rack's
gateway. The choice itself without sockets, too."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.kafka.api import ApiKey
from ledgerd.kafka.replica_selector import NO_PREFERENCE, preferred_read_replica
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, KafkaCluster, running_cluster
from tests.kafka.test_topic_admin import _admin, _ask, _create

BOUND_S = 60
PARTITIONS = 4
PER_PARTITION = 200
SIZE = 1000


def test_the_preferred_replica_is_a_gateway_in_the_consumers_rack() -> None:
    racks = {1: "a", 2: "b", 3: "b", 4: "c"}
    choose = preferred_read_replica
    assert choose(client_rack="", leader=1, racks=racks, partition_key="t/0") == NO_PREFERENCE
    assert choose(client_rack="a", leader=1, racks=racks, partition_key="t/0") == NO_PREFERENCE
    assert choose(client_rack="z", leader=1, racks=racks, partition_key="t/0") == NO_PREFERENCE
    assert choose(client_rack="c", leader=1, racks=racks, partition_key="t/0") == 4
    # within a rack, each partition goes to one gateway, and the partitions spread
    picked = {choose(client_rack="b", leader=1, racks=racks, partition_key=f"t/{p}")
              for p in range(32)}
    assert picked == {2, 3}
    assert all(choose(client_rack="b", leader=1, racks=racks, partition_key="t/5")
               == choose(client_rack="b", leader=4, racks=racks, partition_key="t/5")
               for _ in range(3))


@pytest.fixture
def two_racks(zookeeper: ZooKeeperServer, tmp_path: Path,
              ) -> Iterator[tuple[KafkaCluster, GatewayProcess, GatewayProcess]]:
    def env(node: int) -> dict[str, str]:
        return {"LEDGERD_NODE_ID": str(node), "LEDGERD_GATEWAY_RACK": f"rack{node}",
                "LEDGERD_GATEWAY_RACK_AWARE_READS": "true"}

    with fresh_chroot(zookeeper, "rack_reads") as zk:
        a = GatewayProcess(zk, tmp_path / "a.log", env=env(1))
        with running_cluster(tmp_path, zk, 3, a) as cluster:
            b = GatewayProcess(zk, tmp_path / "b.log", env=env(2))
            b.start()
            try:
                yield cluster, a, b
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)


def _leaders(gateway: GatewayProcess, topic: str) -> dict[int, int]:
    reply = _ask(gateway, ApiKey.METADATA, 9, {"topics": [{"name": topic}],
                                                "allow_auto_topic_creation": False,
                                                "include_topic_authorized_operations": False})
    return {p["partition_index"]: p["leader_id"] for p in reply["topics"][0]["partitions"]}


def _fetch(gateway: GatewayProcess, topic: str, partition: int, rack: str,
           offset: int = 0) -> dict[str, Any]:
    reply = _ask(gateway, ApiKey.FETCH, 11, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": rack})
    return reply["responses"][0]["partitions"][0]  # type: ignore[no-any-return]


def test_a_consumer_reads_through_the_gateway_in_its_rack(
        two_racks: tuple[KafkaCluster, GatewayProcess, GatewayProcess]) -> None:
    from confluent_kafka import Consumer, Producer

    cluster, a, b = two_racks
    admin = _admin(cluster)
    deadline = time.monotonic() + BOUND_S
    while len(admin.list_topics(timeout=BOUND_S).brokers) < 2:
        assert time.monotonic() < deadline, "the second gateway never showed in Metadata"
        time.sleep(0.2)
    _create(admin, "racked", PARTITIONS)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 5})
    for half in (range(PER_PARTITION // 2), range(PER_PARTITION // 2, PER_PARTITION)):
        # two rounds: what the first wrote is visible to followers once the second's
        # adds carry its last add confirmed to the bookies
        for p in range(PARTITIONS):
            for i in half:
                producer.produce("racked", value=b"%d-%05d-" % (p, i) + b"x" * (SIZE - 10),
                                 partition=p)
            producer.poll(0)
        assert producer.flush(BOUND_S) == 0

    nodes = admin.describe_cluster().result(BOUND_S).nodes
    assert {n.id: n.rack for n in nodes} == {1: "rack1", 2: "rack2"}
    md = admin.list_topics("racked", timeout=BOUND_S)
    assert all(sorted(p.replicas) == [1, 2] and p.replicas[0] == p.leader
               for p in md.topics["racked"].partitions.values())
    leaders = _leaders(a, "racked")
    on_b = [p for p, node in leaders.items() if node == 2]
    assert on_b, f"no partition led by gateway 2: {leaders}"
    # the leader sends a consumer of the other rack there, with no records ...
    sent = _fetch(b, "racked", on_b[0], "rack1")
    assert sent["preferred_read_replica"] == 1 and sent["records"] == b""
    assert sent["high_watermark"] == PER_PARTITION
    # ... and serves one of its own rack, or one that names none
    for rack in ("rack2", ""):
        served = _fetch(b, "racked", on_b[0], rack)
        assert served["preferred_read_replica"] == -1 and served["records"]
    # one at the tail stays with the leader (the follower may not see that far yet),
    # and so does one past the end: the leader answers it out of range itself
    for offset in (PER_PARTITION - 1, PER_PARTITION):
        tail = _fetch(b, "racked", on_b[0], "rack1", offset)
        assert tail["preferred_read_replica"] == -1 and tail["error_code"] == 0
    past = _fetch(b, "racked", on_b[0], "rack1", PER_PARTITION + 5)
    assert past["preferred_read_replica"] == -1 and past["error_code"] == 1
    # the gateway there serves the partition (it does not lead it), up to what it has
    # learnt is acknowledged (the writer's explicit LAC reaches the bookies within
    # LEDGERD_EXPLICIT_LAC_INTERVAL_MS)
    follower = _fetch(a, "racked", on_b[0], "rack1")
    while follower["high_watermark"] < PER_PARTITION:
        assert time.monotonic() < deadline, f"the follower never caught up: {follower}"
        time.sleep(0.1)
        follower = _fetch(a, "racked", on_b[0], "rack1")
    assert follower["records"] and follower["preferred_read_replica"] == -1

    stats: list[dict[str, Any]] = []
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "racked-g",
                         "auto.offset.reset": "earliest", "client.rack": "rack1",
                         "enable.auto.commit": False, "statistics.interval.ms": 200,
                         "stats_cb": lambda raw: stats.append(json.loads(raw))})
    try:
        consumer.subscribe(["racked"])
        got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        while sum(map(len, got.values())) < PARTITIONS * PER_PARTITION:
            assert time.monotonic() < deadline + BOUND_S, "not every record was read"
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got[msg.partition()].append(msg.value()[:8])
        assert all(got[p] == [b"%d-%05d-" % (p, i) for i in range(PER_PARTITION)]
                   for p in range(PARTITIONS))
        # statistics taken after every record was read (every 200 ms; bounded only to
        # stop a hang): older ones may not count the last fetches yet
        stats_by = time.monotonic() + BOUND_S
        seen = len(stats)
        while len(stats) <= seen:
            assert time.monotonic() < stats_by, "no statistics after the reads"
            consumer.poll(0.2)
    finally:
        consumer.close()
    rx = {s["nodeid"]: s["rxbytes"] for s in stats[-1]["brokers"].values()
          if s["nodeid"] >= 0}
    # every record came through gateway 1, the one in the consumer's rack
    assert rx[1] > PARTITIONS * PER_PARTITION * SIZE, rx
    assert rx[2] < PER_PARTITION * SIZE, rx
