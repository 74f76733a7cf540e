"""Supervisor, disk checker, sd_notify, admin HTTP: each on its own."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.appliance.diskcheck import DiskChecker, disk_verdict, full_after
from ledgerd.appliance.handlers import AdminHooks, ServingState
from ledgerd.appliance.http import AdminHttp
from ledgerd.appliance.looplag import loop_lag_monitor
from ledgerd.appliance.metrics import BookieMetrics, FastHistogram
from ledgerd.appliance.sdnotify import notify, watchdog_interval, watchdog_service
from ledgerd.appliance.supervisor import Supervisor
from ledgerd.base.logs import _FIELDS_ATTR
from ledgerd.disk.storage import DirUsage
from ledgerd.wire.messages import AdminKind


class Boom(Exception):
    pass


async def test_supervisor_restarts_non_critical_with_doubling_backoff(autojump_clock: Any) -> None:
    starts: list[float] = []
    restarts: list[str] = []

    async def flaky(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) < 4:
            raise Boom("flaky")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, on_critical=lambda *_: pytest.fail("not critical"),
                         on_restart=restarts.append, min_backoff=1.0, max_backoff=8.0)
        await sup.start("flaky", flaky)
        await trio.sleep(100)
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(starts)]
        assert gaps == [1.0, 2.0, 4.0]
        assert restarts == ["flaky"] * 3
        await sup.stop("flaky")
        nursery.cancel_scope.cancel()


async def test_supervisor_critical_failure_calls_back_once(autojump_clock: Any) -> None:
    calls: list[tuple[str, str]] = []

    async def journal(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(1)
        raise Boom("disk gone")

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, on_critical=lambda n, e: calls.append((n, str(e))))
        await sup.start("journal", journal, critical=True)
        await trio.sleep(10)
    assert calls == [("journal", "disk gone")]


async def test_supervisor_stop_logs_errors_the_stop_caused_as_one_line(
        autojump_clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A replication worker being stopped while the bookie's shutdown closes the
    connection its copies write through: some copies fail as others are cancelled.
    The stop absorbs the cancellation; the failures are one log line, not an exception
    group out of the bookie's root nursery."""
    async def copy_fails_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise Boom("did not store entries 151..151: connection closed") from None

    async def worker(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as copies:
            for _ in range(3):
                copies.start_soon(copy_fails_when_cancelled)
            copies.start_soon(trio.sleep_forever)
            task_status.started()

    caplog.set_level(logging.INFO, "ledgerd.appliance.supervisor")
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, on_critical=lambda *_: pytest.fail("not critical"))
        await sup.start("autorecovery", worker)
        await trio.sleep(1)
        await sup.stop("autorecovery")
    stopped = [r for r in caplog.records if r.getMessage() == "service_stopped_with_error"]
    assert len(stopped) == 1
    assert getattr(stopped[0], _FIELDS_ATTR)["errors"] == 3


async def test_supervisor_start_failure_raises_to_the_caller() -> None:
    async def broken(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        raise Boom("bad config")

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, on_critical=lambda *_: None)
        with pytest.raises(Boom):
            await sup.start("broken", broken)


def _usage(fraction: float) -> list[DirUsage]:
    return [DirUsage(Path("/d"), 1000, int(1000 * fraction), 1000 - int(1000 * fraction))]


def test_disk_full_has_hysteresis() -> None:
    assert not full_after(_usage(0.95), False, 0.95, 0.90)
    assert full_after(_usage(0.951), False, 0.95, 0.90)
    assert full_after(_usage(0.92), True, 0.95, 0.90)
    assert not full_after(_usage(0.89), True, 0.95, 0.90)


async def test_disk_checker_reports_changes_only(autojump_clock: Any) -> None:
    levels = iter([0.5, 0.97, 0.96, 0.93, 0.85, 0.85])
    changes: list[bool] = []
    checker = DiskChecker(lambda: _usage(next(levels)), lambda full, _r: changes.append(full),
                          threshold=0.95, lwm=0.90, interval_s=1.0)
    for _ in range(6):
        await checker.check()
    assert changes == [True, False]


async def test_disk_checker_ignores_a_full_report_older_than_the_space_coming_back(
        autojump_clock: Any) -> None:
    """A checkpoint's ENOSPC from before an operator freed space, delivered after the
    check that saw the space back, must not flap the bookie read-only again; a write
    that fails after that check still counts."""
    changes: list[bool] = []
    checker = DiskChecker(lambda: _usage(0.5), lambda full, _r: changes.append(full),
                          threshold=0.95, lwm=0.90, interval_s=1.0)
    await checker.check()
    assert checker.force_full("ENOSPC", began=trio.current_time())
    assert not checker.force_full("ENOSPC again", began=trio.current_time())  # already
    stale = trio.current_time()
    await trio.sleep(1)
    await checker.check()  # 50% used: writable again
    assert changes == [True, False]
    assert not checker.force_full("ENOSPC from a write begun before", began=stale)
    assert changes == [True, False] and not checker.full
    await trio.sleep(1)
    assert checker.force_full("ENOSPC from a later write", began=trio.current_time())
    assert changes == [True, False, True] and checker.full


async def test_a_stale_full_report_has_the_checker_sample_at_once(autojump_clock: Any) -> None:
    """The write a stale report is about may have filled the freed space again: the
    report is not taken, but the checker samples at once instead of a minute later."""
    level = [0.99]
    changes: list[tuple[bool, float]] = []
    checker = DiskChecker(lambda: _usage(level[0]),
                          lambda full, _r: changes.append((full, trio.current_time())),
                          threshold=0.95, lwm=0.90, interval_s=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(checker.run)  # full from the first check
        stale = trio.current_time()
        level[0] = 0.5
        await trio.sleep(1.5)  # sampled every second while full: space back
        assert [full for full, _ in changes] == [True, False]
        level[0] = 0.99  # filled again
        t0 = trio.current_time()
        assert not checker.force_full("ENOSPC", began=stale)
        with trio.fail_after(120):
            while len(changes) < 3:
                await trio.sleep(0.01)
        assert changes[2][0] and changes[2][1] - t0 < 1, changes
        nursery.cancel_scope.cancel()


async def test_disk_checker_after_enospc_logs_only_what_changed(
        autojump_clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    """While a forced full lasts (checkpoints keep meeting ENOSPC), each check does not
    say again that the journal, never full, has space back."""
    changes: list[bool] = []
    ledger = [0.5]
    checker = DiskChecker(lambda: _dirs(j=0.1, l1=ledger[0]),
                          lambda full, _r: changes.append(full),
                          threshold=0.95, lwm=0.90, interval_s=1.0)
    await checker.check()
    ledger[0] = 0.93  # under the threshold, over the low-water mark: full after ENOSPC
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ledgerd.appliance.diskcheck"):
        for _ in range(3):
            checker.force_full("ENOSPC", began=trio.current_time())
            await trio.sleep(0.1)
            await checker.check()
    said = [(r.getMessage(), str(getattr(r, _FIELDS_ATTR, {}).get("path", "")))
            for r in caplog.records]
    assert ("directory_space_back", "/j") not in said, said
    assert [m for m, _ in said].count("disk_full") == 1 and changes == [True], said


def test_sd_notify_sends_datagrams(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert notify("READY=1", {"NOTIFY_SOCKET": path})
        assert sock.recv(100) == b"READY=1"
    assert not notify("READY=1", {})
    assert watchdog_interval({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "x"}) is None


async def test_watchdog_pings_at_half_interval(tmp_path: Path, autojump_clock: Any) -> None:
    path = str(tmp_path / "wd")
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: watchdog_service(
                lambda: True, env=env, task_status=task_status))
            await trio.sleep(3.5)
            nursery.cancel_scope.cancel()
        pings = []
        while True:
            try:
                pings.append(sock.recv(100))
            except BlockingIOError:
                break
    assert pings == [b"WATCHDOG=1"] * 4  # t = 0, 1, 2, 3


def test_admin_http_routes() -> None:
    state = ServingState()
    metrics = BookieMetrics()
    metrics.count(1, 0, 3)
    triggered: list[AdminKind] = []
    admin = AdminHooks(trigger=lambda k: triggered.append(k) is None, status=lambda: {"a": 1},
                       secret="pw")
    http = AdminHttp(metrics, state, admin, host="127.0.0.1", port=0)
    code, _ctype, body = http.respond(b"GET /metrics HTTP/1.1\r\nHost: x", trusted=True)
    assert code == 200 and b'ledgerd_bookie_requests_total{api="ADD",status="OK"} 3.0' in body
    assert http.respond(b"GET /status HTTP/1.1", trusted=False)[2] == b'{"a": 1}\n'
    assert http.respond(b"GET /health HTTP/1.1", trusted=False)[0] == 200
    state.set(True, "disk full")
    assert http.respond(b"GET /health HTTP/1.1", trusted=False)[:1] == (503,)
    assert http.respond(b"POST /admin/gc HTTP/1.1", trusted=False)[0] == 403
    # With a token configured, loopback is no pass: the token is.
    denied = http.respond(b"POST /admin/compaction/major HTTP/1.1", trusted=True)
    assert denied[0] == 403 and b"admin token" in denied[2]
    assert http.respond(b"POST /admin/gc HTTP/1.1\r\nAuthorization: Bearer nope",
                        trusted=True)[0] == 403
    assert http.respond(b"POST /admin/gc HTTP/1.1\r\nX-Ledgerd-Secret: pw", trusted=False)[0] == 202
    assert http.respond(b"POST /admin/compaction/major HTTP/1.1\r\nauthorization: bearer pw",
                        trusted=False)[0] == 202
    assert http.respond(b"GET /admin/gc HTTP/1.1", trusted=True)[0] == 405
    assert http.respond(b"GET /nope HTTP/1.1", trusted=True)[0] == 404
    assert http.respond(b"garbage", trusted=True)[0] == 400
    assert triggered == [AdminKind.GC, AdminKind.MAJOR_COMPACTION]
    # No token configured: loopback peers only (the development default).
    open_admin = AdminHttp(metrics, state, AdminHooks(trigger=lambda k: True,
                                                      status=lambda: {}), host="127.0.0.1",
                           port=0)
    assert open_admin.respond(b"POST /admin/gc HTTP/1.1", trusted=True)[0] == 202
    refused = open_admin.respond(b"POST /admin/gc HTTP/1.1", trusted=False)
    assert refused[0] == 403 and b"admin_secret_file" in refused[2]


def test_fast_histogram_buckets_and_quantiles() -> None:
    h = FastHistogram((0.001, 0.01, 0.1))
    h.observe(0.0005, 90)
    h.observe(0.05, 10)
    assert h.count == 100 and h.quantile(0.5) == 0.001 and h.quantile(0.99) == 0.1
    fam = h.family("x_seconds", "doc")
    values = {s.labels.get("le"): s.value for s in fam.samples if s.name == "x_seconds_bucket"}
    assert values == {"0.001": 90, "0.01": 90, "0.1": 100, "+Inf": 100}


def _dirs(**fractions: float) -> list[DirUsage]:
    """journal=0.5, l1=0.97, ... -> usage rows (role from the name's first letter)."""
    roles = {"j": "journal", "l": "ledger", "i": "index"}
    return [DirUsage(Path(f"/{name}"), 1000, int(1000 * abs(f)), 1000 - int(1000 * abs(f)),
                     roles[name[0]], "EIO" if f < 0 else "")
            for name, f in fractions.items()]


def test_read_only_only_when_every_ledger_directory_is_full() -> None:
    """BookKeeper's rule: one full ledger directory is skipped, not fatal; all full (or
    failing), or the journal's, makes the bookie read-only."""
    none: frozenset[Path] = frozenset()
    v = disk_verdict(_dirs(j=0.5, l1=0.97, l2=0.5), none, 0.95, 0.90)
    assert v.full == {Path("/l1")} and not v.read_only
    v = disk_verdict(_dirs(j=0.5, l1=0.97, l2=0.96), none, 0.95, 0.90)
    assert v.read_only and "all 2 directories" in v.reason and "/l1 is 97.0% full" in v.reason
    v2 = disk_verdict(_dirs(j=0.5, l1=0.92, l2=0.89), v.full, 0.95, 0.90)
    assert v2.full == {Path("/l1")} and not v2.read_only  # hysteresis, per directory
    v = disk_verdict(_dirs(j=0.96, l1=0.1, l2=0.1), none, 0.95, 0.90)
    assert v.read_only and v.reason.startswith("journal directory unusable")
    v = disk_verdict(_dirs(j=0.5, l1=-0.1, l2=0.2), none, 0.95, 0.90)
    assert v.failed == {Path("/l1")} and not v.read_only and v.unusable == {Path("/l1")}
    v = disk_verdict(_dirs(j=0.5, l1=-0.1, l2=0.97), none, 0.95, 0.90)
    assert v.read_only and "/l1: EIO" in v.reason


async def test_disk_checker_tells_storage_which_directories_to_skip(autojump_clock: Any) -> None:
    levels = iter([(0.5, 0.5), (0.97, 0.5), (0.97, 0.97), (0.85, 0.97), (0.85, 0.5)])
    changes: list[bool] = []
    skipped: list[set[Path]] = []

    def usage() -> list[DirUsage]:
        a, b = next(levels)
        return _dirs(j=0.1, l1=a, l2=b)
    checker = DiskChecker(usage, lambda full, _r: changes.append(full), threshold=0.95,
                          lwm=0.90, interval_s=1.0,
                          on_dirs=lambda unusable, _failed: skipped.append(unusable))
    for _ in range(5):
        await checker.check()
    assert changes == [True, False]
    assert skipped == [set(), {Path("/l1")}, {Path("/l1"), Path("/l2")}, {Path("/l2")}, set()]


def _hold_the_loop(logged: threading.Event) -> None:
    """A synchronous step that keeps the event loop until the watchdog has logged it."""
    assert logged.wait(30), "the watchdog never logged the held loop"


async def test_a_held_event_loop_is_logged_with_the_code_that_held_it() -> None:
    logged = threading.Event()
    records: list[logging.LogRecord] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "event_loop_held":
                records.append(record)
                logged.set()

    watched = logging.getLogger("ledgerd.appliance.looplag")
    seen = Seen()
    watched.addHandler(seen)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(loop_lag_monitor, FastHistogram((0.01, 0.1)),
                                        warn_after=0.05))
            _hold_the_loop(logged)
            nursery.cancel_scope.cancel()
    finally:
        watched.removeHandler(seen)
    kv = getattr(records[0], _FIELDS_ATTR)
    assert kv["held_ms"] >= 50
    assert kv["stack"].startswith("wait (threading.py:")  # innermost first
    assert "_hold_the_loop (test_services.py:" in kv["stack"]


def test_the_watchdog_logs_a_stall_once_and_the_next_one_again() -> None:
    from ledgerd.appliance.looplag import _Watchdog

    records: list[logging.LogRecord] = []

    class Mine(logging.Handler):  # this thread's looks only (not another test's thread)
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == threading.get_ident():
                records.append(record)

    watched = logging.getLogger("ledgerd.appliance.looplag")
    mine = Mine()
    watched.addHandler(mine)
    try:
        now = [100.0]
        watch = _Watchdog(threading.get_ident(), 0.1, lambda: now[0])
        watch.due = 100.0
        looks = []
        for t in (100.05, 100.15, 100.2, 100.5):  # the tick is overdue from 100.1 on
            now[0] = t
            assert watch.look()
            looks.append(len(records))
        assert looks == [0, 1, 1, 1]  # logged once, however long it lasts
        watch.due = 100.51  # the monitor ran, then the loop was held again
        now[0] = 100.7
        assert watch.look() and len(records) == 2
        assert getattr(records[1], _FIELDS_ATTR)["held_ms"] == 190.0
        gone = _Watchdog(-1, 0.1, lambda: now[0])  # no such thread: the watchdog ends
        gone.due = 0.0
        assert not gone.look()
    finally:
        watched.removeHandler(mine)


def test_a_draining_bookie_stays_read_only_whatever_the_disks_say() -> None:
    state = ServingState()
    state.draining = True
    assert state.set(True, "read-only by an admin request (draining)")
    assert not state.set(False, "")  # the disk checker found room: still draining
    assert state.read_only and "draining" in state.reason
    state.draining = False
    assert state.set(False, "") and not state.read_only
