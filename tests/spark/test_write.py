"""df.write.format("ledgerd"): a ledger per task, one CAS onto the log, nothing on failure."""

from __future__ import annotations

from typing import Any

import pytest

import ledgerd
from tests.spark.conftest import SparkCluster


def _log_state(client: ledgerd.SyncClient, name: str) -> tuple[tuple[int, ...], int]:
    record, version = client.call(client.client.logs.store.get, name)
    return record.ledgers, version


def _writer(df: Any, cluster: SparkCluster, log: str) -> Any:
    return (df.write.format("ledgerd").option("zk", cluster.zk).option("log", log)
            .option("password", "pw").option("ensemble_size", "3").option("write_quorum", "2")
            .option("ack_quorum", "2").mode("append"))


def test_written_dataframe_reads_back_equal_as_one_commit(spark: Any,
                                                          cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        with client.logs.open_writer("sink", 3, 2, 2, password=b"pw") as writer:
            writer.append(b"before")
        before, version = _log_state(client, "sink")

        df = spark.range(0, 1000, numPartitions=4).selectExpr(
            "cast(concat('row', id) as binary) as payload")
        _writer(df, cluster, "sink").save()

        after, new_version = _log_state(client, "sink")
        assert new_version == version + 1  # one compare-and-set
        assert after[: len(before)] == before and len(after) == len(before) + 4
        for lid in after[len(before):]:
            md = client.ledger_metadata(lid)
            assert md.is_closed and md.last_entry_id == 249
            assert md.custom_metadata["log"] == "sink"
        got = (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "sink")
               .option("password", "pw").load().collect())
        order = {lid: i for i, lid in enumerate(after)}
        got.sort(key=lambda r: (order[r.ledger_id], r.entry_id))
        assert [bytes(r.payload) for r in got] == [b"before"] + [
            f"row{i}".encode() for i in range(1000)]


def test_rows_without_a_payload_column_are_written_as_json(spark: Any,
                                                           cluster: SparkCluster) -> None:
    df = spark.createDataFrame([("ann", 3), ("bob", 5)], "user string, n long").coalesce(1)
    _writer(df, cluster, "people").save()
    back = (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "people")
            .option("password", "pw").option("decode", "json")
            .schema("user string, n long").load())
    assert sorted((r.user, r.n) for r in back.collect()) == [("ann", 3), ("bob", 5)]


def test_a_failed_job_leaves_the_log_and_the_ledgers_unchanged(spark: Any,
                                                               cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        with client.logs.open_writer("audit-trail", 3, 2, 2, password=b"pw") as writer:
            writer.append(b"kept")
        state = _log_state(client, "audit-trail")
        ledgers = set(client.list_ledgers())
        # Partition 3 holds id 900: its payload is null, which fails that task after
        # it has written 150 rows; the other tasks have written theirs by then or soon.
        df = spark.range(0, 1000, numPartitions=4).selectExpr(
            "case when id = 900 then null else cast(concat('r', id) as binary) end as payload")
        with pytest.raises(Exception, match="null payload"):
            _writer(df, cluster, "audit-trail").option("batch", "50").save()
        assert _log_state(client, "audit-trail") == state
        assert set(client.list_ledgers()) == ledgers
        with pytest.raises(Exception, match="append"):
            _writer(df, cluster, "audit-trail").mode("overwrite").save()
