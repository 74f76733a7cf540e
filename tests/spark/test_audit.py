"""``ledgerd audit`` on Spark: it finds exactly the entries removed from one bookie."""

from __future__ import annotations

import itertools
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.disk.index import INDEX_HEADER_SIZE, index_path
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.tools.audit import AuditTask, bookie_runs, plan_ledger, run_audit, summarize
from ledgerd.tools.cli import main
from tests.cluster import metadata_store, wait_registered
from tests.spark.conftest import SparkCluster


def test_bookie_runs_and_plans() -> None:
    assert bookie_runs(0, 9, 3, 3, 1) == [(0, 9)]
    # E=3, Qw=2: bookie 0 holds entries 0, 2, 3, 5, 6, 8, 9 (write sets {e, e+1} mod 3).
    assert bookie_runs(0, 9, 3, 2, 0) == [(0, 0), (2, 3), (5, 6), (8, 9)]
    for e, qw in [(3, 2), (5, 3), (5, 1), (4, 3), (7, 2)]:
        for index in range(e):
            for first, last in [(0, 40), (3, 29), (11, 11), (6, 5)]:
                held = [x for x in range(first, last + 1) if index in write_set(x, e, qw)]
                runs = bookie_runs(first, last, e, qw, index)
                assert [x for a, b in runs for x in range(a, b + 1)] == held
                assert all(b1 + 1 < a2 for (_, b1), (a2, _) in itertools.pairwise(runs))
    task = AuditTask(7, 0, 9, "b:1", 0, 3, 2)
    assert task.expected == 7
    md = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                        ensembles=((0, ("a:1", "b:1", "c:1")), (50, ("a:1", "d:1", "c:1"))),
                        state=LedgerState.CLOSED, last_entry_id=119)
    tasks = plan_ledger(7, md, 40)
    assert sum(t.expected for t in tasks) == 120 * 2  # every entry on Qw bookies
    assert {(t.first, t.last) for t in tasks} == {(0, 39), (40, 49), (50, 89), (90, 119)}
    still_open = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                ensembles=md.ensembles)
    assert {t.last for t in plan_ledger(7, still_open, 1000)} == {49}  # not the last fragment


def test_an_open_ledger_is_never_ok_unchecked() -> None:
    """An OPEN ledger with one fragment (its writer may be dead) has nothing the audit
    may check: it says so instead of reporting OK after checking 0 entries."""
    one = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                         ensembles=((0, ("a:1", "b:1", "c:1")),))
    assert plan_ledger(8, one, 100) == []
    (s,) = summarize({8: one}, [], [])
    assert s["status"] == "NOT CHECKED" and s["replicas_checked"] == 0
    assert "entries from 0 (its last fragment) not checked" in s["note"]
    two = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                         ensembles=((0, ("a:1", "b:1", "c:1")), (50, ("a:1", "d:1", "c:1"))))
    tasks = plan_ledger(9, two, 1000)
    (s,) = summarize({9: two}, tasks, [])
    assert s["status"] == "OK" and "entries from 50" in s["note"]
    closed = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                            ensembles=two.ensembles, state=LedgerState.CLOSED,
                            last_entry_id=60)
    (s,) = summarize({9: closed}, plan_ledger(9, closed, 1000), [])
    assert s["status"] == "OK" and s["note"] == ""


def _drop_entries(bookie_dir: Path, ledger_id: int, entries: list[int]) -> None:
    """Zero the entries' locations in the bookie's index file (the bookie is stopped)."""
    path = index_path(bookie_dir / "ledgers", ledger_id)
    with path.open("r+b") as f:
        for e in entries:
            f.seek(INDEX_HEADER_SIZE + 8 * e)
            assert struct.unpack(">q", f.read(8))[0] != 0, f"entry {e} was not in {path}"
            f.seek(INDEX_HEADER_SIZE + 8 * e)
            f.write(bytes(8))


def test_audit_finds_exactly_the_removed_entries(spark: Any, cluster: SparkCluster,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        full = client.create_ledger(3, 3, 2, password=b"pw")
        full.append_many(b"f%d" % i for i in range(500))
        full.close()
        striped = client.create_ledger(3, 2, 2, password=b"pw")
        striped.append_many(b"s%d" % i for i in range(300))
        striped.close()
        victim = cluster.by_id(full.metadata.ensemble_for(0)[0])
        index = striped.metadata.ensemble_for(0).index(victim.bookie_id)
        held = [e for e in range(300) if index in ((e % 3), (e + 1) % 3)]

    assert victim.terminate() == 0  # graceful: the index is written out at the checkpoint
    _drop_entries(victim.base, full.ledger_id, [*range(100, 150), 300])
    _drop_entries(victim.base, striped.ledger_id, held[10:14])

    async def restart() -> None:
        victim.start()
        async with metadata_store(cluster.zk, init=False) as store:
            await wait_registered(store, victim)
    trio.run(restart)

    report = run_audit(spark, {"zk": cluster.zk}, ledgers=[full.ledger_id, striped.ledger_id],
                       entries_per_task=128)
    b = victim.bookie_id
    assert report.rows == sorted([
        (full.ledger_id, 100, 149, b, 50, "absent"),
        (full.ledger_id, 300, 300, b, 1, "absent"),
        (striped.ledger_id, held[10], held[13], b, 4, "absent"),
    ])
    summary = {s["ledger_id"]: s for s in report.summary}
    assert summary[full.ledger_id]["replicas_checked"] == 1500
    assert summary[full.ledger_id]["missing"] == 51
    assert summary[striped.ledger_id]["replicas_checked"] == 600
    assert summary[striped.ledger_id]["status"] == "UNDERREPLICATED"
    assert report.missing.count() == 3

    # The command: same findings, exit 3, and --mark queues both ledgers.
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--zk", cluster.zk, "--ledgers",
              f"{full.ledger_id},{striped.ledger_id}", "--mark", "--json"])
    assert exit_info.value.code == 3
    out = json.loads(capsys.readouterr().out)
    assert out["marked"] == sorted([full.ledger_id, striped.ledger_id])
    assert [m["missing"] for m in out["missing"]] == [r[4] for r in report.rows]

    async def queued() -> list[tuple[int, tuple[str, ...]]]:
        async with metadata_store(cluster.zk, init=False) as store:
            manager = UnderreplicationManager(store)
            return [(u.ledger_id, u.missing_replicas)
                    async for u in manager.list_underreplicated()]
    assert sorted(trio.run(queued)) == sorted([(full.ledger_id, (b,)),
                                               (striped.ledger_id, (b,))])


def test_audit_of_a_healthy_cluster_reports_nothing(spark: Any, cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        lh = client.create_ledger(3, 2, 2)
        lh.append_many(b"%d" % i for i in range(200))
        lh.close()
    report = run_audit(spark, {"zk": cluster.zk}, ledgers=[lh.ledger_id])
    assert report.rows == [] and report.summary[0]["status"] == "OK"
    assert report.summary[0]["replicas_checked"] == 400


def _audit_process(zk: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "audit", "--zk", zk,
                             "--master", "local[1]", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_command_says_what_it_does_and_nothing_of_spark(cluster: SparkCluster) -> None:
    with ledgerd.SyncClient(cluster.zk) as client:
        lh = client.create_ledger(3, 2, 2)
        lh.append_many(b"%d" % i for i in range(50))
        lh.close()
    proc = _audit_process(cluster.zk, "--ledgers", str(lh.ledger_id), "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["summary"][0]["status"] == "OK"
    lines = err.splitlines()
    # Spark's banners and warnings go to its own log, named in the first line.
    assert all(line.startswith("audit: ") for line in lines), err
    assert lines[0].startswith("audit: starting Spark (local[1]); its own log: /")
    assert lines[1] == "audit: checking 1 ledger(s): 3 fragment replica(s) in 3 Spark task(s)"
    assert lines[-1].startswith("audit: done in ")
    # Spark's log and scratch files were the run's own: gone with a run that worked.
    spark_log = Path(lines[0].split("its own log: ")[1].split(" (kept if")[0])
    assert spark_log.name == "spark.log" and not spark_log.parent.exists()


def _java_children(pid: int) -> list[int]:
    out = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                stat = (proc_dir / "stat").read_text()
            except OSError:
                continue
            name, rest = stat.split(" (", 1)[1].rsplit(") ", 1)
            if name == "java" and int(rest.split()[1]) == pid:
                out.append(int(proc_dir.name))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_ctrl_c_is_not_an_error_and_leaves_no_jvm(cluster: SparkCluster) -> None:
    """SIGINT while Spark starts (its JVM up, the context not yet): exit 130, one line,
    and no Spark JVM left running (it ignores SIGINT; the audit stops it by PID)."""
    import time

    proc = _audit_process(cluster.zk)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("audit: starting Spark"), first
    deadline = time.monotonic() + 60
    while not (jvms := _java_children(proc.pid)):
        assert time.monotonic() < deadline and proc.poll() is None, "no Spark JVM started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # while Spark starts (it takes seconds)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert out == "" and err == "audit: interrupted (Ctrl-C): no result\n", err
    assert [p for p in jvms if _alive(p)] == []
    assert not Path(first.split("its own log: ")[1].split(" (kept if")[0]).parent.exists()
