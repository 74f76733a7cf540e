"""readStream.format("ledgerd"): micro-batches that tail a log or an open ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ledgerd
from tests.spark.conftest import SparkCluster


def _run_available_now(spark: Any, cluster: SparkCluster, out: Path, **options: str) -> Any:
    reader = spark.readStream.format("ledgerd").option("zk", cluster.zk)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("parquet")
             .option("path", str(out / "rows")).option("checkpointLocation", str(out / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return query


def _read_rows(spark: Any, out: Path) -> list[tuple[int, int, bytes]]:
    return sorted((r.ledger_id, r.entry_id, bytes(r.payload))
                  for r in spark.read.parquet(str(out / "rows")).collect())


def test_available_now_picks_up_log_appends_between_runs_exactly_once(
        spark: Any, cluster: SparkCluster, tmp_path: Path) -> None:
    # No explicit LAC: the last entry stays invisible, as this case expects.
    with ledgerd.SyncClient(cluster.zk, explicit_lac_interval_ms=0) as client:
        writer = client.logs.open_writer("tail", 3, 2, 2, password=b"pw", roll_entries=300)
        written = writer.append_many(f"a{i}".encode() for i in range(400))
        writer.append(b"a400")  # the entries before it become visible (LAC 399)
        opts = {"log": "tail", "password": "pw", "maxEntriesPerTrigger": "150"}

        first = _run_available_now(spark, cluster, tmp_path, **opts)
        assert len([p for p in first.recentProgress if p["numInputRows"]]) >= 3
        rows = _read_rows(spark, tmp_path)
        assert [(lid, eid) for lid, eid, _ in rows] == [(p.ledger_id, p.entry_id)
                                                        for p in written]

        more = writer.append_many(f"b{i}".encode() for i in range(250))
        writer.close()  # closes the last ledger: every entry is readable now
        _run_available_now(spark, cluster, tmp_path, **opts)
        rows = _read_rows(spark, tmp_path)
        a400 = (written[-1].ledger_id, written[-1].entry_id + 1)
        want = sorted([*((p.ledger_id, p.entry_id) for p in [*written, *more]), a400])
        assert [(lid, eid) for lid, eid, _ in rows] == want  # each entry once
        assert sorted(payload for _, _, payload in rows) == sorted(
            [f"a{i}".encode() for i in range(401)] + [f"b{i}".encode() for i in range(250)])

        # A third run finds nothing new and writes nothing.
        _run_available_now(spark, cluster, tmp_path, **opts)
        assert len(_read_rows(spark, tmp_path)) == 651


def test_available_now_tails_an_open_ledger(spark: Any, cluster: SparkCluster,
                                            tmp_path: Path) -> None:
    # No explicit LAC: the last entry stays invisible, as this case expects.
    with ledgerd.SyncClient(cluster.zk, explicit_lac_interval_ms=0) as client:
        lh = client.create_ledger(3, 3, 2, password=b"pw")
        lh.append_many(f"x{i}".encode() for i in range(100))
        lh.append(b"x100")
        opts = {"ledger": str(lh.ledger_id), "password": "pw"}
        _run_available_now(spark, cluster, tmp_path, **opts)
        assert [e for _, e, _ in _read_rows(spark, tmp_path)] == list(range(100))
        lh.append_many(f"x{i}".encode() for i in range(101, 150))
        lh.close()
        _run_available_now(spark, cluster, tmp_path, **opts)
        rows = _read_rows(spark, tmp_path)
        assert [(e, p) for _, e, p in rows] == [(i, f"x{i}".encode()) for i in range(150)]
