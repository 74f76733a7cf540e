"""The Kafka gateway's state in a metadata snapshot (issue 49): topics, groups and their
committed offsets are exported with everything else, and a restore gives them back node
for node, at the same versions (restored under another root of the same ZooKeeper, so
the running gateway is left alone)."""

from __future__ import annotations

import json
import subprocess
import sys
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
    assert diff["same"] and not diff["version_only"], diff


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
            zk.delete(f"/{chroot}/ledgers", recursive=True)

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
