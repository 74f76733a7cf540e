"""spark.read.format("ledgerd"): ledgers and logs, closed and open, read back equal."""

from __future__ import annotations

import json
from typing import Any

import pytest

import ledgerd
from tests.spark.conftest import SparkCluster


def _rows(df: Any) -> list[tuple[int, int, Any]]:
    return sorted((r.ledger_id, r.entry_id, r.payload) for r in df.collect())


def test_closed_and_open_ledgers_read_back_equal(spark: Any, cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        closed = client.create_ledger(3, 2, 2, password=b"pw")
        closed.append_many(f"c{i}".encode() for i in range(2500))
        closed.close()
        live = client.create_ledger(3, 3, 2, password=b"pw")
        live.append_many(f"o{i}".encode() for i in range(300))
        live.append(b"o300")  # carries LAC 299 (the batch's adds all went out before it)
        lac = client.open_ledger(live.ledger_id, b"pw", recovery=False).read_lac()
        assert lac >= 299

        def reader() -> Any:  # a DataFrameReader keeps its options: one per read
            return (spark.read.format("ledgerd").option("zk", cluster.zk)
                    .option("password", "pw").option("entries_per_partition", "700"))

        df = reader().option("ledgers", f"{closed.ledger_id},{live.ledger_id}").load()
        assert df.schema.simpleString() == (
            "struct<ledger_id:bigint,entry_id:bigint,payload:binary>")
        assert df.rdd.getNumPartitions() == 4 + 1
        want = [(closed.ledger_id, i, f"c{i}".encode()) for i in range(2500)]
        want += [(live.ledger_id, i, f"o{i}".encode()) for i in range(lac + 1)]
        assert _rows(df) == sorted(want)
        # The reader fenced nothing: the writer goes on.
        assert live.append(b"after") == 301
        live.close()

        ranged = (reader().option("ledger", str(closed.ledger_id)).option("first_entry", "10")
                  .option("last_entry", "19").option("decode", "utf8").load())
        assert [r.payload for r in ranged.orderBy("entry_id").collect()] == [
            f"c{i}" for i in range(10, 20)]


def test_log_reads_in_order_across_rolled_ledgers(spark: Any, cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        with client.open_log_writer("clicks", 3, 2, 2, password=b"pw",
                                    roll_entries=500) as writer:
            writer.append_many(json.dumps({"user": f"u{i % 7}", "n": i}).encode()
                               for i in range(1200))
        ledgers = client.log_ledgers("clicks")
        assert len(ledgers) == 3

        df = (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "clicks")
              .option("password", "pw").option("decode", "json")
              .schema("ledger_id long, entry_id long, user string, n long").load())
        rows = df.orderBy("n").collect()
        assert [r.n for r in rows] == list(range(1200))
        assert [(r.ledger_id, r.entry_id) for r in rows] == [
            (ledgers[i // 500], i % 500) for i in range(1200)]
        counts = {r.user: r["count"] for r in df.groupBy("user").count().collect()}
        assert counts == {f"u{k}": len(range(k, 1200, 7)) for k in range(7)}


def test_json_decode_needs_a_schema(spark: Any, cluster: SparkCluster) -> None:
    with pytest.raises(Exception, match=r"decode.*json only with a schema"):
        (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "clicks")
         .option("decode", "json").load())
