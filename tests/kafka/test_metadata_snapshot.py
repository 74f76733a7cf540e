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
