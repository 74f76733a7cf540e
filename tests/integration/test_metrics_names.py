"""BookKeeper's metric names on a real bookie, and the Grafana dashboard built on them:
every series a panel queries is exported."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.testing.cluster import EVENT_BOUND_S
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.messages import AddRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry
from tests.cluster import admin_get, metadata_store, wait_registered

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "ledgerd-bookies.json"
# PromQL words in the dashboard's expressions that are not series names.
PROMQL = {"rate", "sum", "max", "by", "histogram_quantile", "instance", "le", "success",
          "quantile", "true", "false"}


def _samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """Series name -> [(labels, value)] of a Prometheus text exposition."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
        assert m, line
        out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


async def _scrape_until(b: BookieProcess, done: Callable[[dict[str, list[tuple[str, float]]]],
                                                         bool]) -> dict[str, list[tuple[str, float]]]:
    """The bookie's /metrics once ``done`` holds for them (bounded only to stop a hang)."""
    with trio.fail_after(EVENT_BOUND_S):
        while True:
            code, body = await admin_get(b.admin_port, "/metrics")
            assert code == 200
            series = _samples(body)
            if done(series):
                return series
            await trio.sleep(0.05)


async def test_bookkeeper_names_and_the_dashboard(bookie_factory: Callable[..., BookieProcess],
                                                  zk_chroot: str) -> None:
    b = bookie_factory(flush_interval_ms=200)  # checkpoints write (and open) index files
    async with metadata_store(zk_chroot) as store:
        b.start()
        await wait_registered(store, b)
    async with open_bookie_client(b.bookie_id) as c:
        for e in range(20):
            req = AddRequest(ledger_id=5, first_entry_id=e, master_key=KEY,
                             entries=(entry(5, e),))
            assert (await c.call(req))[0] == Status.OK
        for e in range(10):
            assert (await c.call(ReadRequest(ledger_id=5, entry_id=e)))[0] == Status.OK
    # Add replies leave from the journal's syncer; the bookie counts them when its event
    # loop collects the group, which can come after the reply: scrape until it has.
    series = await _scrape_until(b, lambda series: dict(
        series["bookkeeper_server_ADD_ENTRY_REQUEST_count"]).get('{success="true"}', 0) >= 20)
    assert series["bookie_SERVER_STATUS"] == [("", 1.0)]
    assert series["ledgerd_zookeeper_connected"] == [("", 1.0)]
    assert series["bookie_ledgers_count"] == [("", 1.0)]
    assert series["bookie_ledger_writable_dirs"] == [("", 1.0)]
    adds = dict(series["bookkeeper_server_ADD_ENTRY_REQUEST_count"])
    assert adds['{success="true"}'] >= 20 and adds['{success="false"}'] == 0
    p99 = dict(series["bookkeeper_server_ADD_ENTRY_REQUEST"])['{quantile="0.99",success="true"}']
    assert 0 < p99 <= 10_000  # milliseconds, as BookKeeper's summaries
    assert series["bookie_WRITE_BYTES"][0][1] >= 20 * len(entry(5, 0))
    # What an operator tuning the caches watches (issue #48 item 14): bytes read, index
    # pages held, index and entry-log files open.
    assert series["bookie_READ_BYTES"] == [("", 10.0 * len(entry(5, 0)))]
    assert series["ledgerd_bookie_read_bytes_total"] == [("", 10.0 * len(entry(5, 0)))]
    assert series["ledgerd_bookie_entries_read_total"] == [("", 10.0)]
    assert series["ledgerd_ledger_cache_pages"][0][1] >= 1
    assert series["bookie_NUM_INDEX_PAGES"] == series["ledgerd_ledger_cache_pages"]
    assert series["ledgerd_open_entry_log_files"][0][1] >= 0
    # the first checkpoint after the adds writes the ledger's index file
    series = await _scrape_until(b, lambda series: series["ledgerd_open_index_files"][0][1] >= 1)
    assert series["ledgerd_open_index_files"] == [("", 1.0)]
    assert "process_resident_memory_bytes" in series and "python_info" in series
    # 20 small groups: the first prealloc step (zeroed at open) still covers them.
    assert series["ledgerd_journal_slow_groups_total"] == [("", 0.0)]
    assert series["ledgerd_journal_zeroed_ahead_bytes_total"] == [("", 0.0)]
    # One add at a time over the hub: every reply left from the journal's syncer.
    assert series["ledgerd_bookie_syncer_replies_total"][0][1] >= 1
    assert series["ledgerd_bookie_syncer_short_sends_total"] == [("", 0.0)]

    dashboard = json.loads(DASHBOARD.read_text())
    wanted = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", target["expr"])
            wanted |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                       if w not in PROMQL}
    assert len(wanted) >= 15
    missing = sorted(w for w in wanted if w not in series)
    assert not missing, f"the dashboard queries series this bookie does not export: {missing}"
