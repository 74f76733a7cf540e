"""writeStream.format("ledgerd"): micro-batches appended exactly once, and orphans swept.

The end-to-end case is the one the issue names: a streaming query copies log A to log B
while a writer keeps appending to A; the driver process is killed inside the window a
replay comes from (the batch's CAS done, Spark's commit record not yet written) and
restarted from its checkpoint; B then holds every entry of A exactly once, in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.logs import LogRecord
from ledgerd.metadata.store import WatchKind
from ledgerd.spark.options import WriteOptions
from ledgerd.spark.sink import PAUSE_ENV, LedgerdStreamCommit, LedgerdStreamWriter
from ledgerd.tools.cli import main
from tests.spark.conftest import ROOT, SparkCluster


def _await_log(client: ledgerd.SyncClient, name: str, what: str,
               check: Callable[[LogRecord], Awaitable[Any]], timeout: float) -> Any:
    """Wait on a ZooKeeper watch of the log's record (no clock polling) until
    ``check(record)`` returns something true; returns that (AssertionError naming
    ``what`` after ``timeout``)."""
    inner = client.client

    async def run() -> Any:
        with trio.move_on_after(timeout):
            async with inner.store.watch(inner.logs.store.path(name), WatchKind.DATA) as events:
                async for _ in events:  # the first one at once, then on every change
                    try:
                        record, _ = await inner.logs.store.get(name)
                    except NoNodeError:
                        continue
                    got = await check(record)
                    if got:
                        return got
        raise AssertionError(f"timed out waiting for {what}")

    return client.call(run)


def _tagged(client: ledgerd.SyncClient, log: str, query: str, batch: int) -> int:
    lh = client.create_ledger(3, 2, 2, password=b"pw", custom_metadata={
        "log": log, "spark_partition": "0", "spark_write": query, "spark_batch": str(batch)})
    lh.append(b"%s batch %d" % (query.encode(), batch))
    lh.close()
    return lh.ledger_id


def _msg(lid: int, query: str, batch: int, partition: int = 0) -> LedgerdStreamCommit:
    return LedgerdStreamCommit(partition, lid, 1, query, batch)


def test_a_replayed_batch_is_not_appended_again(spark: Any, cluster: SparkCluster) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    writer = LedgerdStreamWriter(WriteOptions.parse({"zk": cluster.zk, "log": "replayed",
                                                     "password": "pw"}),
                                 StructType([StructField("payload", BinaryType())]))
    with ledgerd.SyncClient(cluster.zk) as client:
        # A task Spark killed in an earlier run of this query: tagged, never listed.
        orphan = _tagged(client, "replayed", "q-1", 0)
        first = [_tagged(client, "replayed", "q-1", 0) for _ in range(2)]
        writer.commit([_msg(first[1], "q-1", 0, 1), _msg(first[0], "q-1", 0, 0)], 0)
        record, version = client.call(client.client.logs.store.get, "replayed")
        assert record.ledgers == tuple(first) and dict(record.commits) == {"q-1": 0}
        ids = set(client.list_ledgers())
        assert orphan not in ids  # the first commit swept this query's leftovers

        # Spark replays batch 0 (its commit record was lost): new ledgers, same batch id.
        again = [_tagged(client, "replayed", "q-1", 0) for _ in range(2)]
        writer.commit([_msg(again[0], "q-1", 0), _msg(again[1], "q-1", 0, 1)], 0)
        assert client.call(client.client.logs.store.get, "replayed") == (record, version)
        assert not set(again) & set(client.list_ledgers())  # the second copy is gone

        # The next batch goes on; another query's batch 0 is its own.
        nxt = _tagged(client, "replayed", "q-1", 1)
        writer.commit([_msg(nxt, "q-1", 1)], 1)
        other = _tagged(client, "replayed", "q-2", 0)
        writer.commit([_msg(other, "q-2", 0)], 0)
        record, _ = client.call(client.client.logs.store.get, "replayed")
        assert record.ledgers == (*first, nxt, other)
        assert dict(record.commits) == {"q-1": 1, "q-2": 0}
        assert [e.payload for e in client.logs.read("replayed", b"pw")] == \
            [b"q-1 batch 0", b"q-1 batch 0", b"q-1 batch 1", b"q-2 batch 0"]


def test_sweepspark_deletes_orphans_and_nothing_listed(
        cluster: SparkCluster, capsys: pytest.CaptureFixture[str]) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        listed = _tagged(client, "swept", "job-1", 0)
        client.logs.append_ledgers("swept", [listed], password=b"pw")
        orphan = _tagged(client, "swept", "job-1", 3)
        plain = client.create_ledger(3, 2, 2, password=b"pw")  # not Spark's
        plain.close()

        def sweep(*args: str) -> tuple[int, str, str]:
            code = 0
            try:
                main(["shell", "--zk", cluster.zk, "sweepspark", *args])
            except SystemExit as exc:
                code = int(exc.code or 0)
            out = capsys.readouterr()
            return code, out.out, out.err

        code, out, _ = sweep("--older-than", "1d", "--log", "swept")
        assert code == 0 and out.strip() == "deleted 0 orphaned ledger(s)"  # too young
        code, out, _ = sweep("--older-than", "0s", "--log", "swept", "--dry-run", "--json")
        assert [r["ledger_id"] for r in json.loads(out)] == [orphan]
        assert orphan in client.list_ledgers()
        code, out, _ = sweep("--older-than", "0s", "--log", "swept")
        assert out.strip().endswith("deleted 1 orphaned ledger(s)") and str(orphan) in out
        ids = set(client.list_ledgers())
        assert orphan not in ids and {listed, plain.ledger_id} <= ids
        code, _, err = sweep("--older-than", "soon")
        assert code == 2 and "--older-than" in err and "'soon' is not a duration" in err


def _driver(cluster: SparkCluster, ckpt: Path, out: Path, **env: str) -> subprocess.Popen[bytes]:
    with out.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.stream_copy", "--zk", cluster.zk, "--src",
             "A", "--dst", "B", "--checkpoint", str(ckpt)], cwd=ROOT, start_new_session=True,
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **env})


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM, its Python workers
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _batches(ckpt: Path, kind: str) -> list[int]:
    d = ckpt / kind
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def test_driver_killed_mid_batch_then_restarted_copies_exactly_once(
        cluster: SparkCluster, tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "driver.out"
    total = 3000
    with ledgerd.SyncClient(cluster.zk) as client:
        with client.logs.open_writer("A", 3, 2, 2, password=b"pw", roll_entries=700) as w:
            w.append_many(b"a%d" % i for i in range(300))

            def keep_writing() -> None:  # ~1,000 entries/s while the queries run
                for start in range(300, total, 50):
                    w.append_many(b"a%d" % i for i in range(start, start + 50))
                    time.sleep(0.05)  # the source's rate (an open-loop schedule)

            appender = threading.Thread(target=keep_writing)
            appender.start()
            first = _driver(cluster, ckpt, out, **{PAUSE_ENV: "600"})
            try:
                # A batch's CAS is in the log; its commit sleeps before Spark records it.
                async def first_commit(record: LogRecord) -> tuple[str, int] | None:
                    return record.commits[-1] if record.commits else None  # (query, batch)
                query, n = _await_log(client, "B", "a batch appended to B", first_commit,
                                      timeout=180)
                assert query == json.loads((ckpt / "metadata").read_text())["id"]
            finally:
                _kill(first)
            # The window: Spark planned batch n and B holds it, but Spark's commit log
            # does not have it, so the restarted query replays it.
            assert _batches(ckpt, "offsets")[-1] == n and n not in _batches(ckpt, "commits")
            second = _driver(cluster, ckpt, out)
            try:
                appender.join()
            except BaseException:
                _kill(second)
                raise
        try:  # A's writer is closed: every entry of A is readable now
            async def copied(record: LogRecord) -> bool:  # B's ledgers are closed ones
                counts = [(await client.client.ledger_metadata(lid)).last_entry_id + 1
                          for lid in record.ledgers]
                return sum(counts) >= total
            _await_log(client, "B", "B to catch up with A", copied, timeout=240)
        finally:
            _kill(second)
        got = [e.payload for e in client.logs.read("B", b"pw")]
        assert got == [b"copy:a%d" % i for i in range(total)], (
            f"{len(got)} entries; driver output:\n{out.read_text()[-3000:]}")
        record, _ = client.call(client.client.logs.store.get, "B")
        assert record.last_batch(query) > n  # the restarted query went on past the replay
