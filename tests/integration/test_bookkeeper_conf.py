"""A bookie started from BookKeeper's own bk_server.conf (issue #48 items 3 and 14).

tests/ledgerd/data/bk_server.conf is BookKeeper's shipped conf/bk_server.conf with the
edits an operator makes (worker threads, group-commit knobs, intervals, a continued
``ledgerDirectories`` line with a ``\\u`` escape, ``:`` and blank separators): a
bookie must start from it as written, with only its paths, ZooKeeper and ports pointed
at this test's. Its log settings (log_file, log_levels) come from the environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.messages import AddRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry
from tests.cluster import metadata_store, wait_registered

BK_SERVER_CONF = Path(__file__).resolve().parents[1] / "ledgerd" / "data" / "bk_server.conf"


def operator_conf(b: BookieProcess, zk: str, base: Path) -> Path:
    """The shipped-and-edited file, its paths under ``base``, its ZooKeeper ``zk`` and
    its ports ``b``'s."""
    text = BK_SERVER_CONF.read_text().replace("/tmp/", f"{base}/")
    text = text.replace("localhost:2181", zk)
    text = re.sub(r"(?m)^bookiePort=.*$", f"bookiePort={b.port}", text)
    text = re.sub(r"(?m)^prometheusStatsHttpPort=.*$", f"prometheusStatsHttpPort={b.admin_port}",
                  text)
    path = base / "bk_server.conf"
    path.write_text(text)
    return path


async def test_a_bookie_runs_from_a_bk_server_conf(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str, tmp_path: Path) -> None:
    b = bookie_factory()
    b.config_path = operator_conf(b, zk_chroot, tmp_path)
    log_file = tmp_path / "bookie-file.log"
    b.start(env={"LEDGERD_LOG_FILE": str(log_file),
                 "LEDGERD_LOG_LEVELS": "ledgerd.appliance.config=WARNING",
                 "LEDGERD_JOURNAL_DIRECTORYS": "/typo"})
    async with metadata_store(zk_chroot) as store:
        await wait_registered(store, b)
    async with open_bookie_client(b.bookie_id) as c:
        for e in range(3):
            req = AddRequest(ledger_id=7, first_entry_id=e, master_key=KEY, entries=(entry(7, e),))
            assert (await c.call(req))[0] == Status.OK
        status, reply = await c.call(ReadRequest(ledger_id=7, entry_id=2))
        assert status == Status.OK and reply.entry == entry(7, 2)  # type: ignore[union-attr]
    assert await trio.to_thread.run_sync(b.terminate) == 0
    # The files live where the conf says: two ledger directories (the continued line).
    assert list((tmp_path / "bk-txn" / "current").glob("*.txn"))
    assert (tmp_path / "bk-data" / "current").is_dir()
    assert (tmp_path / "bk-data2" / "current").is_dir()
    assert (tmp_path / "bk-index" / "current").is_dir()
    text = log_file.read_text()
    # Each ignored name warned once, on one line, saying why ...
    warned = re.findall(r"event=config_bookkeeper_name note=\"[^\"]*: (\w+) ignored: ", text)
    assert {"numAddWorkerThreads", "bookieDeathWatchInterval",
            "journalAdaptiveGroupWrites"} <= set(warned), text
    assert len(warned) == len(set(warned))
    # ... as is a LEDGERD_* variable that names no setting ...
    assert "event=config_unknown_environment note=\"environment variable " \
           "LEDGERD_JOURNAL_DIRECTORYS names no setting and is ignored; did you mean " \
           "LEDGERD_JOURNAL_DIRECTORY?\"" in text, text
    # ... and log_levels quieted the config logger's INFO lines, not the others'.
    assert "event=config_effective" not in text and "event=listening" in text
    assert "event=listening" in b.log_path.read_text()  # stderr still has every line
