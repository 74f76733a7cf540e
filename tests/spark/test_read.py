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
    # No explicit LAC: the last entry stays invisible, as this case expects.
    with ledgerd.SyncClient(cluster.zk, explicit_lac_interval_ms=0) as client:
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
        with client.logs.open_writer("clicks", 3, 2, 2, password=b"pw",
                                     roll_entries=500) as writer:
            writer.append_many(json.dumps({"user": f"u{i % 7}", "n": i}).encode()
                               for i in range(1200))
        ledgers = client.logs.ledgers("clicks")
        assert len(ledgers) == 3
        # Entry 0 of each ledger is its log header: entry e of ledger 1 holds n = 499 + e.
        tail = client.logs.read("clicks", b"pw", start=ledgerd.LogPosition(ledgers[1], 499))
        assert [json.loads(e.payload)["n"] for e in tail] == list(range(998, 1200))
        with pytest.raises(ledgerd.LedgerdError, match="has no ledger 424242"):
            list(client.logs.read("clicks", b"pw", start=ledgerd.LogPosition(424242, 0)))

        df = (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "clicks")
              .option("password", "pw").option("decode", "json")
              .schema("ledger_id long, entry_id long, user string, n long").load())
        rows = df.orderBy("n").collect()
        assert [r.n for r in rows] == list(range(1200))
        assert [(r.ledger_id, r.entry_id) for r in rows] == [
            (ledgers[i // 500], i % 500 + 1) for i in range(1200)]
        counts = {r.user: r["count"] for r in df.groupBy("user").count().collect()}
        assert counts == {f"u{k}": len(range(k, 1200, 7)) for k in range(7)}


def test_json_decode_needs_a_schema(spark: Any, cluster: SparkCluster) -> None:
    with pytest.raises(Exception, match=r"decode.*json only with a schema"):
        (spark.read.format("ledgerd").option("zk", cluster.zk).option("log", "clicks")
         .option("decode", "json").load())


def test_bad_input_fails_the_job_naming_the_ledger_and_the_cause(
        spark: Any, cluster: SparkCluster) -> None:
    from ledgerd.tools.zkserver import find_free_port

    with ledgerd.SyncClient(cluster.zk) as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        lh.append_many([b"a", b"b"])
        lh.close()

    def load(**options: str) -> Any:
        reader = spark.read.format("ledgerd").option("zk", cluster.zk)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load().collect()

    with pytest.raises(Exception, match="ledger 987654321 does not exist"):
        load(ledger="987654321")
    with pytest.raises(Exception, match="log 'no-such-log' does not exist"):
        load(log="no-such-log")
    with pytest.raises(Exception, match=f"ledger {lh.ledger_id}: wrong password"):
        load(ledger=str(lh.ledger_id), password="guess")
    with pytest.raises(Exception, match="exactly one of ledger, ledgers or log"):
        load(ledger=str(lh.ledger_id), log="x")
    with pytest.raises(Exception, match="'decode': got 'xml'"):
        load(ledger=str(lh.ledger_id), decode="xml")
    with pytest.raises(Exception, match="'entries_per_partition': got '0'"):
        load(ledger=str(lh.ledger_id), entries_per_partition="0")
    with pytest.raises(Exception, match="last_entry 5 is past its last entry 1"):
        load(ledger=str(lh.ledger_id), password="pw", last_entry="5")
    with pytest.raises(Exception, match=r"client\.no_such_key"):
        load(ledger=str(lh.ledger_id), **{"client.no_such_key": "1"})
    with pytest.raises(Exception, match="metadata service unavailable"):
        (spark.read.format("ledgerd").option("zk", f"127.0.0.1:{find_free_port()}")
         .option("client.zk_timeout_ms", "1500").option("ledger", "1").load().collect())


def test_a_ledger_deleted_mid_read_fails_the_partition(cluster: SparkCluster) -> None:
    from pyspark.sql.types import StructType

    from ledgerd.spark.options import LedgerRange, ReadOptions
    from ledgerd.spark.source import SCHEMA, read_partition

    with ledgerd.SyncClient(cluster.zk) as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        lh.append_many(b"%d" % i for i in range(100))
        lh.close()
        opts = ReadOptions.parse({"zk": cluster.zk, "ledger": str(lh.ledger_id),
                                  "password": "pw", "read_window": "10"})
        batches = read_partition(opts, StructType.fromDDL(SCHEMA),
                                 LedgerRange(lh.ledger_id, 0, 99, True))
        first = next(batches)
        assert first.num_rows == 10
        client.delete_ledger(lh.ledger_id)
        with pytest.raises(ledgerd.LedgerdError,
                           match=f"ledger {lh.ledger_id} entries 0..99: the ledger was "
                                 "deleted while it was read"):
            list(batches)
        with pytest.raises(ledgerd.LedgerdError, match="deleted before it was read"):
            list(read_partition(opts, StructType.fromDDL(SCHEMA),
                                LedgerRange(lh.ledger_id, 0, 99, True)))
