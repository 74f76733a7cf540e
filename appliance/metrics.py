"""The bookie's metrics, exposed in the Prometheus text format.

The hot path counts into plain ints and list buckets (``observe_many`` records a whole
frame's entries in one call); a custom collector turns them into metric families when
Prometheus scrapes. prometheus_client's own Histogram costs a lock and a label lookup
per observation, which at 100k adds/s would be a tenth of a core.

Besides the ``ledgerd_*`` families, the names BookKeeper's Prometheus provider exports
for the same facts are exported too, so dashboards and alerts written for BookKeeper or
Pulsar bookies work unchanged: ``bookie_SERVER_STATUS`` (1 writable, 0 read-only),
``bookkeeper_server_ADD_ENTRY_REQUEST`` and ``bookkeeper_server_READ_ENTRY_REQUEST``
(latency in milliseconds as BookKeeper's OpStatsLogger summaries: ``success`` label,
``quantile`` 0.5 ... 1.0, ``_count``, ``_sum``), ``bookie_journal_JOURNAL_SYNC``,
``bookie_journal_JOURNAL_QUEUE_SIZE``, ``bookie_ledgers_count``,
``bookie_ledger_writable_dirs``, ``bookie_WRITE_BYTES``, ``bookie_READ_BYTES`` and
``bookie_NUM_INDEX_PAGES``. Quantiles come from the
histograms' buckets (each is its bucket's upper bound), not from a sliding window.
The process and Python collectors (``process_*``, ``python_*``) come along.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from ledgerd.base.histogram import BK_QUANTILES, LATENCY_BUCKETS, FastHistogram
from ledgerd.wire.messages import ApiKey
from ledgerd.wire.status import Status

__all__ = ["BK_QUANTILES", "LATENCY_BUCKETS", "BookieMetrics", "FastHistogram"]

GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)


class BookieMetrics:
    """Counters of one bookie; ``gauges`` are read at scrape time."""

    def __init__(self) -> None:
        self.requests: dict[tuple[int, int], int] = {}
        self.add_latency = FastHistogram(LATENCY_BUCKETS)
        self.read_latency = FastHistogram(LATENCY_BUCKETS)
        self.journal_group_records = FastHistogram(GROUP_BUCKETS)
        self.journal_sync_latency = FastHistogram(LATENCY_BUCKETS)
        self.loop_lag = FastHistogram(LATENCY_BUCKETS)
        self.checkpoint_latency = FastHistogram(LATENCY_BUCKETS)
        self.journal_bytes = 0
        self.entries_added = 0
        self.entry_bytes_added = 0
        self.entries_read = 0             # entries sent by reads (single, range, stride)
        self.entry_bytes_read = 0
        self.connections_opened = 0
        self.connections_refused = 0      # over max_connections
        self.connections_idle_closed = 0  # idle past connection_idle_timeout_s
        self.connections_rejected_frames = 0
        self.syncer_replies = 0           # add replies the journal's syncer sent whole
        self.syncer_short_sends = 0       # syncer sends a full socket did not take whole
        self.tls_handshakes = 0           # connections upgraded with START_TLS
        self.tls_failures = 0             # handshakes that failed, TLS_REQUIRED refusals
        self.requests_unauthorized = 0    # refused by authorization (the principal's roles)
        self.requests_failed = 0          # raised what no rule expects: IO_ERROR, logged
        self.service_restarts: dict[str, int] = {}
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.counters: dict[str, tuple[str, Callable[[], float]]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def count(self, api: int, status: int, n: int = 1) -> None:
        key = (api, status)
        self.requests[key] = self.requests.get(key, 0) + n

    def on_journal_group(self, records: int, nbytes: int, sync_seconds: float) -> None:
        self.journal_group_records.observe(records)
        self.journal_sync_latency.observe(sync_seconds)
        self.journal_bytes += nbytes

    def gauge(self, name: str, doc: str, fn: Callable[[], float]) -> None:
        self.gauges[name] = (doc, fn)

    def counter(self, name: str, doc: str, fn: Callable[[], float]) -> None:
        self.counters[name] = (doc, fn)

    def exposition(self) -> bytes:
        """The Prometheus text format of everything above."""
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, m: BookieMetrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        req = CounterMetricFamily("ledgerd_bookie_requests", "Requests answered, by api and status.",
                                  labels=["api", "status"])
        for (api, status), n in sorted(m.requests.items()):
            req.add_metric([_name(ApiKey, api), _name(Status, status)], n)
        yield req
        yield m.add_latency.family("ledgerd_bookie_add_latency_seconds",
                                   "Add request latency, receipt to durable reply.")
        yield m.read_latency.family("ledgerd_bookie_read_latency_seconds",
                                    "Read request latency (long polls excluded).")
        yield m.journal_group_records.family("ledgerd_journal_group_records",
                                             "Records per journal group commit.")
        yield m.journal_sync_latency.family("ledgerd_journal_sync_seconds",
                                            "Journal write + fdatasync time per group.")
        yield m.loop_lag.family("ledgerd_bookie_event_loop_lag_seconds",
                                "How late the event loop ran a task due every 10 ms.")
        yield m.checkpoint_latency.family("ledgerd_storage_checkpoint_seconds",
                                          "Checkpoint time: write cache or buffers to "
                                          "entry logs, index, syncs, last mark.")
        failed_adds = sum(n for (api, status), n in m.requests.items()
                          if api == ApiKey.ADD and status)
        failed_reads = sum(n for (api, status), n in m.requests.items()
                           if api == ApiKey.READ and status)
        yield m.add_latency.bk_summary("bookkeeper_server_ADD_ENTRY_REQUEST",
                                       "Add request latency, ms (BookKeeper's name).",
                                       failed_adds)
        yield m.read_latency.bk_summary("bookkeeper_server_READ_ENTRY_REQUEST",
                                        "Read request latency, ms (BookKeeper's name).",
                                        failed_reads)
        yield m.journal_sync_latency.bk_summary("bookie_journal_JOURNAL_SYNC",
                                                "Journal write + fdatasync per group, ms "
                                                "(BookKeeper's name).")
        write_bytes = Metric("bookie_WRITE_BYTES", "Entry bytes stored by adds "
                             "(BookKeeper's name, without the _total suffix).", "counter")
        write_bytes.add_sample("bookie_WRITE_BYTES", {}, float(m.entry_bytes_added))
        yield write_bytes
        read_bytes = Metric("bookie_READ_BYTES", "Entry bytes sent by reads "
                            "(BookKeeper's name, without the _total suffix).", "counter")
        read_bytes.add_sample("bookie_READ_BYTES", {}, float(m.entry_bytes_read))
        yield read_bytes
        yield CounterMetricFamily("ledgerd_bookie_read_bytes", "Entry bytes sent by reads "
                                  "(single, range and stride).", value=m.entry_bytes_read)
        yield CounterMetricFamily("ledgerd_bookie_entries_read", "Entries sent by reads.",
                                  value=m.entries_read)
        yield CounterMetricFamily("ledgerd_journal_written_bytes",
                                  "Bytes of journal records made durable.", value=m.journal_bytes)
        yield CounterMetricFamily("ledgerd_bookie_entries_added", "Entries stored by adds.",
                                  value=m.entries_added)
        yield CounterMetricFamily("ledgerd_bookie_connections", "Connections accepted.",
                                  value=m.connections_opened)
        yield CounterMetricFamily("ledgerd_bookie_connections_refused",
                                  "Connections closed at once: max_connections were open.",
                                  value=m.connections_refused)
        yield CounterMetricFamily("ledgerd_bookie_connections_idle_closed",
                                  "Connections closed after connection_idle_timeout_s idle.",
                                  value=m.connections_idle_closed)
        yield CounterMetricFamily("ledgerd_bookie_syncer_replies",
                                  "Add replies the journal's syncer sent the moment their "
                                  "group was durable.", value=m.syncer_replies)
        yield CounterMetricFamily("ledgerd_bookie_syncer_short_sends",
                                  "Syncer sends a socket did not take whole (the rest, and "
                                  "what followed, went from the event loop).",
                                  value=m.syncer_short_sends)
        yield CounterMetricFamily("ledgerd_bookie_tls_handshakes",
                                  "Connections upgraded to TLS (START_TLS).",
                                  value=m.tls_handshakes)
        yield CounterMetricFamily("ledgerd_bookie_tls_failures",
                                  "TLS handshakes that failed, and plaintext connections "
                                  "refused by tls_required.", value=m.tls_failures)
        yield CounterMetricFamily("ledgerd_bookie_requests_unauthorized",
                                  "Requests refused because the principal lacks the role.",
                                  value=m.requests_unauthorized)
        yield CounterMetricFamily("ledgerd_bookie_requests_failed",
                                  "Requests that raised an unexpected error (a bug, logged "
                                  "as request_failed with its traceback), answered "
                                  "IO_ERROR.", value=m.requests_failed)
        restarts = CounterMetricFamily("ledgerd_bookie_service_restarts",
                                       "Supervised service restarts.", labels=["service"])
        for name, n in sorted(m.service_restarts.items()):
            restarts.add_metric([name], n)
        yield restarts
        for name, (doc, fn) in sorted(m.counters.items()):
            yield CounterMetricFamily(name, doc, value=fn())
        for name, (doc, fn) in sorted(m.gauges.items()):
            yield GaugeMetricFamily(name, doc, value=fn())


def _name(enum_cls: type[ApiKey] | type[Status], value: int) -> str:
    try:
        return enum_cls(value).name
    except ValueError:
        return str(value)
