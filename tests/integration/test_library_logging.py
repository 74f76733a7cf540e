"""The client is a library: it never prints on the application's stderr (issue #48 item 4).

Python prints WARNING records of a logger tree without handlers on stderr (its
"last resort" handler); ledgerd's package logger carries a NullHandler so that an
application that configures no logging sees nothing of ledgerd's, even while a bookie
fails under a ledger it writes (``ledger_handle_failed``, connection warnings).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies

# The application: writes to a ledger on both bookies, waits for the test to kill one,
# writes again (the add fails: no bookie is left to replace it), and reports on stdout
# how many WARNING records ledgerd's loggers emitted meanwhile (counted by wrapping
# Logger.callHandlers, which adds no handler, so the last resort would still print).
APP = """
import logging, sys
import ledgerd

warnings = []
call_handlers = logging.Logger.callHandlers
def counting(self, record):
    if record.name.startswith("ledgerd") and record.levelno >= logging.WARNING:
        warnings.append(record.getMessage())
    return call_handlers(self, record)
logging.Logger.callHandlers = counting

with ledgerd.SyncClient(sys.argv[1], add_entry_timeout_ms=2000, throttle=0) as client:
    lh = client.create_ledger(2, 2, 2, password=b"pw")
    lh.append(b"before")
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        lh.append(b"after")
        print("appended")
    except ledgerd.LedgerdError as exc:
        print("failed:", type(exc).__name__)
print("warnings:", len(warnings), sorted(set(warnings)))
"""


async def test_a_failing_bookie_prints_nothing_on_the_applications_stderr(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, tmp_path: Path) -> None:
    bookies = await start_bookies(bookie_factory, zk_chroot, 2)
    app = subprocess.Popen([sys.executable, "-c", APP, zk_chroot], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path)
    try:
        assert app.stdout is not None and app.stdin is not None
        line = await trio.to_thread.run_sync(app.stdout.readline)
        assert line == "ready\n", line + app.communicate(timeout=30)[1]
        bookies[0].kill9()
        out, err = await trio.to_thread.run_sync(lambda: app.communicate("go\n", timeout=60))
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert "failed: " in out, out + err
    warnings = out.split("warnings: ", 1)[1]
    assert int(warnings.split()[0]) >= 1, out  # the client did log its warnings ...
    assert err == "", err  # ... and none reached the application's stderr
