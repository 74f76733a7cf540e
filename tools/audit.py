"""``ledgerd audit``: check on Spark that every bookie holds every entry it should.

For each ledger (or the ones asked for), every fragment's bookies are checked: bookie
``i`` of a fragment's ensemble must hold each entry whose write set contains ``i``. The
driver cuts that work into tasks of at most ``entries_per_task`` entries, one bookie
each; a Spark task asks its bookie with ReadRange for the runs of entries it should
hold and checks that each answer carries the right ledger and entry ids. A closed ledger
is checked to its last entry; an open one up to the end of its second-to-last fragment
(its last fragment is still being written), as BookKeeper's auditor does.

The result is a DataFrame of ``(ledger_id, first_entry, last_entry, bookie, missing,
reason)``, one row per run of missing entries in the bookie's own sequence (reason:
``absent``, ``no such ledger``, ``wrong entry``, ``unreachable: ...``), and a summary per
ledger. ``--mark`` puts every ledger found short into the underreplication queue with
the bookies that lack entries.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import trio

from ledgerd.client import Client
from ledgerd.errors import NoSuchLedgerError
from ledgerd.machines.checker import stored_runs as bookie_runs
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.tools.output import Progress, emit, table
from ledgerd.wire.entry import entry_ids
from ledgerd.wire.messages import ReadRangeRequest, ReadRangeResponse
from ledgerd.wire.status import Status

__all__ = ["AUDIT_SCHEMA", "AuditReport", "AuditTask", "audit_cmd", "bookie_runs",
           "check_task", "plan_ledger", "run_audit"]

AUDIT_SCHEMA = ("ledger_id long, first_entry long, last_entry long, bookie string, "
                "missing long, reason string")
MAX_IN_FLIGHT = 32
READ_BYTES = 4 << 20

Row = tuple[int, int, int, str, int, str]


@dataclass(frozen=True)
class AuditTask:
    """Entries ``first..last`` of one fragment, as bookie ``index`` must hold them."""

    ledger_id: int
    first: int
    last: int
    bookie: str
    index: int
    ensemble_size: int
    write_quorum: int

    @functools.cached_property
    def runs(self) -> list[tuple[int, int]]:
        return bookie_runs(self.first, self.last, self.ensemble_size, self.write_quorum,
                           self.index)

    @property
    def expected(self) -> int:
        return sum(b - a + 1 for a, b in self.runs)


def plan_ledger(ledger_id: int, md: LedgerMetadata, entries_per_task: int) -> list[AuditTask]:
    """The tasks that check one ledger (nothing past a closed ledger's end, nothing in
    an open ledger's last fragment)."""
    tasks = []
    fragments = md.fragments()
    if not md.is_closed:
        fragments = fragments[:-1]
    for first, last, ensemble in fragments:
        if last < first:
            continue
        for index, bookie in enumerate(ensemble):
            for a in range(first, last + 1, entries_per_task):
                tasks.append(AuditTask(ledger_id, a, min(last, a + entries_per_task - 1),
                                       bookie, index, md.ensemble_size, md.write_quorum))
    return tasks


# -- the check on an executor ----------------------------------------------------------

async def check_task(client: Client, task: AuditTask) -> list[Row]:
    """The task's missing entries as rows, one per run of the same reason."""
    timeout = client.config.read_timeout_ms / 1000
    lid = task.ledger_id
    missing: dict[int, str] = {}
    unreachable: list[str] = []
    limit = trio.Semaphore(MAX_IN_FLIGHT)

    async def check_run(a: int, b: int) -> None:
        async with limit:
            e = a
            while e <= b:
                if unreachable:
                    missing.update((x, unreachable[0]) for x in range(e, b + 1))
                    return
                status, resp, error = await client.pool.call(task.bookie, ReadRangeRequest(
                    ledger_id=lid, first_entry_id=e, max_count=b - e + 1,
                    max_bytes=READ_BYTES), timeout)
                if error is not None:
                    unreachable.append(f"unreachable: {error}")
                elif status == Status.NO_SUCH_LEDGER:
                    missing.update((x, "no such ledger") for x in range(e, b + 1))
                    return
                elif (status != Status.OK or not isinstance(resp, ReadRangeResponse)
                      or not resp.entries):
                    missing[e] = "absent" if status == Status.NO_SUCH_ENTRY else _name(status)
                    e += 1
                else:
                    for data in resp.entries[: b - e + 1]:
                        if len(data) < 16 or entry_ids(data) != (lid, e):
                            missing[e] = "wrong entry"
                        e += 1

    async with trio.open_nursery() as nursery:
        for a, b in task.runs:
            nursery.start_soon(check_run, a, b)
    return _collapse(task, missing)


def _name(status: int) -> str:
    try:
        return Status(status).name.lower().replace("_", " ")
    except ValueError:
        return f"status {status}"


def _collapse(task: AuditTask, missing: Mapping[int, str]) -> list[Row]:
    """Group missing entries that follow each other in the bookie's own sequence."""
    spans: list[tuple[int, int, str]] = []  # (first, last, reason)
    open_span = False
    for a, b in task.runs:
        for e in range(a, b + 1):
            reason = missing.get(e)
            if reason is None:
                open_span = False
            elif open_span and spans[-1][2] == reason:
                spans[-1] = (spans[-1][0], e, reason)
            else:
                spans.append((e, e, reason))
                open_span = True
    return [(task.ledger_id, first, last, task.bookie,
             _count(task, first, last), reason) for first, last, reason in spans]


def _count(task: AuditTask, first: int, last: int) -> int:
    """How many entries of ``first..last`` the task's bookie should hold."""
    return sum(min(b, last) - max(a, first) + 1 for a, b in task.runs
               if a <= last and b >= first)


def check_on_worker(client_options: Mapping[str, str], task: AuditTask) -> list[Row]:
    from ledgerd.spark.worker import client_for

    client = client_for(client_options)
    return client.call(check_task, client.client, task)


# -- the job ----------------------------------------------------------------------------

@dataclass
class AuditReport:
    missing: Any  # DataFrame with AUDIT_SCHEMA
    rows: list[Row]
    summary: list[dict[str, Any]]
    skipped: list[str]

    @property
    def short_ledgers(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for lid, _, _, bookie, _, _ in self.rows:
            out.setdefault(lid, set()).add(bookie)
        return out


def run_audit(spark: Any, client_options: Mapping[str, str], *,
              ledgers: Iterable[int] | None = None, log: str | None = None,
              entries_per_task: int = 100_000, mark: bool = False,
              say: Callable[[str], None] | None = None,
              on_tasks: Callable[[int, int], None] | None = None) -> AuditReport:
    """Plan on the driver, check on the executors, summarise (and mark) on the driver.

    ``say`` hears what it is doing (one line per step); ``on_tasks(done, total)`` hears
    the Spark tasks finish, about twice a second."""
    from ledgerd.spark.worker import client_for

    client = client_for(client_options)
    if log is not None:
        wanted = list(client.logs.ledgers(log))
    elif ledgers is not None:
        wanted = list(ledgers)
    else:
        wanted = client.list_ledgers()
    tasks: list[AuditTask] = []
    metas: dict[int, LedgerMetadata] = {}
    skipped: list[str] = []
    for lid in wanted:
        try:
            md = client.ledger_metadata(lid)
        except NoSuchLedgerError:
            if ledgers is not None or log is not None:
                raise
            skipped.append(f"ledger {lid}: deleted while the audit was planned")
            continue
        metas[lid] = md
        tasks += plan_ledger(lid, md, entries_per_task)
    slices = max(1, min(len(tasks), spark.sparkContext.defaultParallelism * 4))
    if say is not None:
        say(f"checking {len(metas)} ledger(s): {len(tasks)} fragment replica(s) in {slices} "
            f"Spark task(s)")
    rdd = spark.sparkContext.parallelize(tasks, slices).flatMap(
        functools.partial(check_on_worker, dict(client_options)))
    with _watch_tasks(spark, on_tasks):
        found = spark.createDataFrame(rdd, AUDIT_SCHEMA).collect() if tasks else []
    rows = _merge([(r.ledger_id, r.first_entry, r.last_entry, r.bookie, r.missing, r.reason)
                   for r in found], metas)
    # The DataFrame holds the merged rows: it agrees with the summary and does not
    # check the bookies again each time it is used.
    report = AuditReport(spark.createDataFrame(rows, AUDIT_SCHEMA), rows,
                         summarize(metas, tasks, rows), skipped)
    if mark:
        manager = UnderreplicationManager(client.client.store,
                                          client.client.config.zk_ledgers_root_path)
        for lid, bookies in report.short_ledgers.items():
            client.call(manager.mark_underreplicated, lid, sorted(bookies))
    return report


def _merge(rows: list[Row], metas: Mapping[int, LedgerMetadata]) -> list[Row]:
    """Join rows that tasks split: same ledger, bookie and reason, and no entry the
    bookie should hold between them (in one fragment)."""
    out: list[Row] = []
    for row in sorted(rows, key=lambda r: (r[0], r[3], r[1])):
        if out and _adjacent(out[-1], row, metas[row[0]]):
            prev = out[-1]
            out[-1] = (prev[0], prev[1], row[2], prev[3], prev[4] + row[4], prev[5])
        else:
            out.append(row)
    return sorted(out)


def _adjacent(prev: Row, row: Row, md: LedgerMetadata) -> bool:
    if (prev[0], prev[3], prev[5]) != (row[0], row[3], row[5]):
        return False
    starts = [first for first, _ in md.ensembles]
    fragment = max(i for i, s in enumerate(starts) if s <= prev[2])
    if fragment != max(i for i, s in enumerate(starts) if s <= row[1]):
        return False
    index = md.ensembles[fragment][1].index(row[3])
    return not bookie_runs(prev[2] + 1, row[1] - 1, md.ensemble_size, md.write_quorum, index)


def summarize(metas: Mapping[int, LedgerMetadata], tasks: list[AuditTask],
             rows: list[Row]) -> list[dict[str, Any]]:
    expected: dict[int, int] = {}
    for t in tasks:
        expected[t.ledger_id] = expected.get(t.ledger_id, 0) + t.expected
    lost: dict[int, int] = {}
    short: dict[int, set[str]] = {}
    for lid, _, _, bookie, count, _ in rows:
        lost[lid] = lost.get(lid, 0) + count
        short.setdefault(lid, set()).add(bookie)
    out = []
    for lid, md in sorted(metas.items()):
        n = lost.get(lid, 0)
        checked = expected.get(lid, 0)
        status, note = ("UNDERREPLICATED" if n else "OK"), ""
        if not md.is_closed:
            # Its last fragment is (or was, if the writer died) being written: what is
            # there is not known until recovery closes it, so it is not audited. Never
            # call a ledger OK when nothing of it could be checked.
            tail = md.last_ensemble[0]
            note = (f"open: entries from {tail} (its last fragment) not checked; close or "
                    f"recover the ledger (`ledgerd shell recover` or open_ledger) to audit "
                    f"them")
            if not checked and not n:
                status = "NOT CHECKED"
        out.append({
            "ledger_id": lid, "state": md.state.value,
            "fragments": len(md.ensembles),
            "replicas_checked": checked, "missing": n,
            "bookies_short": ",".join(sorted(short.get(lid, ()))),
            "status": status, "note": note,
        })
    return out


@contextmanager
def _watch_tasks(spark: Any, on_tasks: Callable[[int, int], None] | None) -> Iterator[None]:
    """Poll Spark's status tracker from a thread while the caller's job runs."""
    if on_tasks is None:
        yield
        return
    stop = threading.Event()

    def poll() -> None:
        tracker = spark.sparkContext.statusTracker()
        while not stop.wait(0.5):
            try:
                infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # the context is stopping (Ctrl-C): nothing more to show
                return
            infos = [i for i in infos if i is not None]
            if infos:
                on_tasks(sum(i.numCompletedTasks for i in infos),
                         sum(i.numTasks for i in infos))

    watcher = threading.Thread(target=poll, name="audit-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=2)


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception): \S")


def spark_error_line(text: str) -> str:
    """The cause in a Spark failure's text (a Python worker's traceback wrapped in a
    JVM stack trace, ~30 lines, the useful line last among them): the last line that
    names an error, as ``Name: message``; the text's first line if none does."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if _ERROR_LINE.match(ln) and not ln.startswith(
        ("py4j.", "org.apache.spark.", "java.", "scala."))]
    return named[-1] if named else (lines[0] if lines else "")


@contextmanager
def jvm_output_to(path: Path | None) -> Iterator[None]:
    """Start Spark's JVM with its stdout and stderr in ``path``: it inherits the file
    descriptors it is started with, and its start-up banners, warnings and stack traces
    (and its Python workers') are not the user's output. None leaves them alone."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def spark_session(master: str, log_path: Path | None = None,
                  local_dir: Path | None = None) -> Any:
    """A session whose workers run this Python (ledgerd importable there too); with
    ``log_path``, Spark's own output goes there; with ``local_dir``, its scratch files
    (``blockmgr-*``, ``artifacts-*``, ``spark-*``) go there instead of /tmp, for the
    caller to remove."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("ledgerd-audit")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if local_dir is not None:
        builder = builder.config("spark.local.dir", str(local_dir)).config(
            "spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={local_dir}")
    with jvm_output_to(log_path):
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _active_session() -> bool:
    """Whether this process already has a SparkSession (a caller's, when the command
    runs in-process): then it is the caller's to stop."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None


def child_pids() -> list[int]:
    """The processes this one started that still run (Spark's JVM among them), by PID
    (from /proc: pyspark does not hand out its gateway process until it is up)."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields_ = stat.rsplit(") ", 1)[1].split()
        if int(fields_[1]) == me and fields_[0] != "Z":
            out.append(int(entry.name))
    return out


def stop_children(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM ``pids`` (our own children), SIGKILL what is left after ``grace``, and
    reap them."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@click.command("audit")
@click.option("--zk", default=None,
              help="ZooKeeper connection string (host:port[,...][/chroot]); default "
                   "$LEDGERD_ZK_SERVERS, else the one running `ledgerd local`, else "
                   "127.0.0.1:2181.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master (local[N], spark://host:port, ...).")
@click.option("--ledgers", default=None, help="Only these ledger ids (comma-separated).")
@click.option("--log", "log_name", default=None, help="Only the ledgers of this log.")
@click.option("--entries-per-task", default=100_000, show_default=True,
              type=click.IntRange(1, None), help="Entries one Spark task checks on one bookie.")
@click.option("--mark", is_flag=True,
              help="Put the ledgers found short into the underreplication queue.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def audit_cmd(ctx: click.Context, zk: str | None, master: str, ledgers: str | None,
              log_name: str | None, entries_per_task: int, mark: bool, as_json: bool) -> None:
    """Check on Spark that every bookie holds every entry of its fragments.

    Exits 3 when entries are missing (after printing them)."""
    from ledgerd.tools.shell import find_cluster

    zk = str(find_cluster(zk, "audit").zk)
    if not (ctx.obj or {}).get("debug"):
        logging.getLogger().setLevel(logging.WARNING)  # client and py4j events are noise
        logging.getLogger("kazoo.client").setLevel(logging.CRITICAL)
    ids = None
    if ledgers is not None:
        try:
            ids = [int(x) for x in ledgers.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter(f"{ledgers!r} is not a comma-separated list of ledger "
                                     "ids", param_hint="--ledgers") from None
    if ids is not None and log_name is not None:
        raise click.BadParameter("pass --ledgers or --log, not both", param_hint="--log")
    debug = bool((ctx.obj or {}).get("debug"))

    def say(line: str) -> None:
        click.echo(f"audit: {line}", err=True)

    started = time.monotonic()
    if not debug:
        # A Python worker's error as one line (its cause), not its traceback.
        os.environ.setdefault("SPARK_HIDE_TRACEBACK", "1")
    # The run's own directory: Spark's log and scratch files. Removed when the audit
    # ends (done or interrupted); kept, and named, when it fails.
    run_dir = Path(tempfile.mkdtemp(prefix="ledgerd-audit-"))
    log_path = None if debug else run_dir / "spark.log"
    (run_dir / "spark-local").mkdir()
    interrupted = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        # Replaces pyspark's handler, whose job cancel re-enters the py4j call being
        # interrupted and logs both as ERRORs: Ctrl-C is the user's wish, not an error.
        interrupted.set()
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    bar = Progress("audit: checking (Spark tasks)", None)
    spark = None
    owned = not _active_session()  # stop only a session this command started
    try:
        say(f"starting Spark ({master})" + (f"; its own log: {log_path} (kept if the audit "
                                            "fails)" if log_path else ""))
        spark = spark_session(master, log_path, run_dir / "spark-local")
        signal.signal(signal.SIGINT, on_sigint)  # starting a context installs pyspark's
        import ledgerd.spark

        ledgerd.spark.register(spark)
        report = run_audit(spark, {"zk": zk}, ledgers=ids, log=log_name,
                           entries_per_task=entries_per_task, mark=mark, say=say,
                           on_tasks=lambda done, total: bar.set(done, total))
        if owned:
            spark.stop()
    except BaseException as exc:
        if not (interrupted.is_set() or isinstance(exc, KeyboardInterrupt)):
            if log_path is not None:
                say(f"failed; Spark's log kept: {log_path}")
            if spark is not None and owned:
                with contextlib.suppress(BaseException):
                    spark.stop()
            if not debug and type(exc).__module__.startswith(("pyspark", "py4j")):
                # A Spark failure is a traceback of tracebacks; its cause is one line.
                raise click.ClickException(spark_error_line(str(exc))) from None
            raise
        bar.close()
        say("interrupted (Ctrl-C): no result" + (", nothing marked" if mark else ""))
        if spark is not None and owned:
            with contextlib.suppress(BaseException):
                spark.stop()
        if owned:
            # Spark's JVM, also when Ctrl-C came while it started (pyspark had not
            # handed it out yet): it ignores SIGINT, and would outlive us.
            stop_children(child_pids())
        shutil.rmtree(run_dir, ignore_errors=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGINT, previous)
    shutil.rmtree(run_dir, ignore_errors=True)
    bar.close()
    say(f"done in {time.monotonic() - started:.1f}s")
    missing = [dict(zip(("ledger_id", "first_entry", "last_entry", "bookie", "missing",
                         "reason"), r, strict=True)) for r in report.rows]
    human = [table(["LEDGER", "STATE", "FRAGMENTS", "REPLICAS", "MISSING", "SHORT", "STATUS"],
                   [[s["ledger_id"], s["state"], s["fragments"], s["replicas_checked"],
                     s["missing"], s["bookies_short"] or "-", s["status"]]
                    for s in report.summary]) if report.summary else "no ledgers to audit"]
    human += [f"ledger {s['ledger_id']}: {s['note']}" for s in report.summary if s["note"]]
    if missing:
        human.append("")
        human.append(table(["LEDGER", "FIRST", "LAST", "BOOKIE", "MISSING", "REASON"],
                           [list(m.values()) for m in missing]))
    if mark and report.short_ledgers:
        human.append(f"\nmarked underreplicated: "
                     f"{', '.join(map(str, sorted(report.short_ledgers)))}")
    human += report.skipped
    emit(as_json, {"summary": report.summary, "missing": missing,
                   "marked": sorted(report.short_ledgers) if mark else [],
                   "skipped": report.skipped}, "\n".join(human))
    if missing:
        sys.exit(3)

