"""KafkaJS (npm ``kafkajs``, pinned in tests/kafka/kafkajs/package-lock.json and
installed by ``make test``) against a real gateway: producer, group consumer and the
admin calls lag monitors and operators use (listGroups, describeGroups, fetchOffsets,
setOffsets, resetOffsets, deleteTopicRecords, deleteGroups). The scenario runs in Node
(tests/kafka/kafkajs/scenario.js) and prints each step's result; every value is checked
here."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tests.kafka.conftest import KafkaCluster

HERE = Path(__file__).parent / "kafkajs"
COUNT = 24


def _scenario(bootstrap: str, topic: str, group: str) -> dict[str, dict[str, Any]]:
    node = shutil.which("node") or shutil.which("nodejs")
    assert node, "node is not installed: run `make test` (it installs nodejs and npm)"
    assert (HERE / "node_modules" / "kafkajs").is_dir(), \
        "kafkajs is not installed: run `make test` (npm ci in tests/kafka/kafkajs)"
    done = subprocess.run([node, str(HERE / "scenario.js"), bootstrap, topic, group, str(COUNT)],
                          capture_output=True, text=True, timeout=180, cwd=HERE,
                          stdin=subprocess.DEVNULL)
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    errors = [s["error"] for s in steps if "error" in s]
    assert done.returncode == 0 and not errors, (
        f"kafkajs scenario failed (exit {done.returncode}): {errors}\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {s["step"]: s for s in steps}


def test_kafkajs_produces_consumes_and_administers_groups(kafka_cluster: KafkaCluster) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"kafkajs-{suffix}", f"kafkajs-group-{suffix}"
    steps = _scenario(kafka_cluster.bootstrap, topic, group)

    assert steps["create"]["created"] is True and steps["create"]["topics"] is True
    sent = steps["produce"]["sent"]
    assert len(sent) == COUNT
    per_partition: dict[int, list[int]] = {}
    for s in sent:
        per_partition.setdefault(s["partition"], []).append(s["offset"])
    # Offsets are dense per partition in the order they were acknowledged.
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))

    received = steps["consume"]["received"]
    assert sorted(int(r["n"]) for r in received) == list(range(COUNT))
    for r in received:
        i = int(r["n"])
        assert r["value"] == f"v{i}" and r["key"] == f"k{i % 4}"
        assert (r["partition"], r["offset"]) == (sent[i]["partition"], sent[i]["offset"])

    assert steps["list"]["groups"] == [group]
    assert steps["describe"]["groups"] == [{"groupId": group, "state": "Empty", "members": 0}]
    ends = {p: len(o) for p, o in per_partition.items()}
    committed = {p["partition"]: p["offset"] for p in steps["offsets"]["partitions"]}
    assert {p: o for p, o in committed.items() if p in ends} == ends

    chosen = steps["produce"]["chosen"]
    set_to = {p["partition"]: p["offset"] for p in steps["set"]["partitions"]}
    assert set_to[chosen] == 1
    assert all(p["offset"] == 0 for p in steps["reset"]["partitions"])

    # Records before offset 2 of the chosen partition are gone; the other keeps all.
    low = {p["partition"]: p for p in steps["delete-records"]["partitions"]}
    assert low[chosen] == {"partition": chosen, "low": 2, "high": ends[chosen]}
    assert all(p["low"] == 0 for q, p in low.items() if q != chosen)

    assert steps["delete-group"]["groups"] == []
