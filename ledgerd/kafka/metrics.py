"""The gateway's Prometheus metrics (``/metrics`` on ``gateway_admin_port``).

Counters are plain integers bumped on the request path; the collector turns them into
families at scrape time, as the bookie's metrics do. Names: ``ledgerd_kafka_*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from ledgerd.base.histogram import LATENCY_BUCKETS, FastHistogram
from ledgerd.kafka.api import ApiKey, ErrorCode

__all__ = ["GatewayMetrics"]


class GatewayMetrics:
    def __init__(self) -> None:
        self.requests: dict[int, int] = {}  # api key -> requests handled
        self.errors: dict[tuple[int, int], int] = {}  # (api, error code) -> partitions/replies
        self.produce_latency = FastHistogram(LATENCY_BUCKETS)
        self.fetch_latency = FastHistogram(LATENCY_BUCKETS)
        self.records_in = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections_opened = 0
        self.connections_refused = 0
        self.connections_closed_bad = 0  # bad frames, unknown APIs, unsupported versions,
        # requests not sent whole within request_read_timeout_ms, responses not read
        # within response_write_timeout_ms
        self.auth_failures = 0
        # compaction (``cleaner.py``)
        self.compaction_passes = 0
        self.compaction_partial_passes = 0  # the offset map filled up
        self.compaction_failures = 0
        self.compaction_records_removed = 0
        self.compaction_bytes_before = 0  # of the ledgers a pass replaced
        self.compaction_bytes_after = 0  # of their replacements
        self.compaction_orphans_deleted = 0
        self.compaction_sweeps = 0  # looks for orphaned replacements
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.counted: dict[str, tuple[str, Callable[[], float]]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        for c in (ProcessCollector, PlatformCollector, GCCollector):
            c(registry=self.registry)

    def error(self, api: int, code: int) -> None:
        if code:
            self.errors[(api, code)] = self.errors.get((api, code), 0) + 1

    def gauge(self, name: str, doc: str, fn: Callable[[], float]) -> None:
        self.gauges[name] = (doc, fn)

    def counter(self, name: str, doc: str, fn: Callable[[], float]) -> None:
        """A count kept elsewhere (``fn`` reads it), exported as a counter."""
        self.counted[name] = (doc, fn)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _name(enum: Any, value: int) -> str:
    try:
        return str(enum(value).name)
    except ValueError:
        return str(value)


class _Collector:
    def __init__(self, m: GatewayMetrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        m = self.m
        req = CounterMetricFamily("ledgerd_kafka_requests", "Kafka requests handled, by API.",
                                  labels=["api"])
        for api, n in sorted(m.requests.items()):
            req.add_metric([_name(ApiKey, api)], n)
        yield req
        err = CounterMetricFamily("ledgerd_kafka_errors",
                                  "Error codes answered (per partition where the API has "
                                  "partitions), by API and error.", labels=["api", "error"])
        for (api, code), n in sorted(m.errors.items()):
            err.add_metric([_name(ApiKey, api), _name(ErrorCode, code)], n)
        yield err
        yield m.produce_latency.family("ledgerd_kafka_produce_latency_seconds",
                                       "Produce requests, receipt to reply (quorum acked).")
        yield m.fetch_latency.family("ledgerd_kafka_fetch_latency_seconds",
                                     "Fetch requests, receipt to reply (long polls included).")
        for name, doc, value in (
                ("ledgerd_kafka_records_produced", "Records acknowledged to producers.",
                 m.records_in),
                ("ledgerd_kafka_produced_bytes", "Record batch bytes acknowledged.", m.bytes_in),
                ("ledgerd_kafka_fetched_bytes", "Record batch bytes sent to consumers.",
                 m.bytes_out),
                ("ledgerd_kafka_connections", "Client connections accepted.",
                 m.connections_opened),
                ("ledgerd_kafka_connections_refused", "Connections closed at once: "
                 "max_connections were open.", m.connections_refused),
                ("ledgerd_kafka_connections_closed_bad", "Connections closed for a bad frame, "
                 "an unknown API, an unsupported version, a request not sent whole "
                 "within request_read_timeout_ms or a response not read within "
                 "response_write_timeout_ms.", m.connections_closed_bad),
                ("ledgerd_kafka_authentication_failures", "SASL authentications refused.",
                 m.auth_failures),
                ("ledgerd_kafka_compaction_passes", "Compaction passes that completed.",
                 m.compaction_passes),
                ("ledgerd_kafka_compaction_partial_passes", "Passes whose offset map filled "
                 "up (compaction_map_bytes): they compacted a prefix of the log.",
                 m.compaction_partial_passes),
                ("ledgerd_kafka_compaction_failures", "Passes that failed (the log was "
                 "left as it was).", m.compaction_failures),
                ("ledgerd_kafka_compaction_records_removed", "Records compaction removed.",
                 m.compaction_records_removed),
                ("ledgerd_kafka_compaction_bytes_before", "Bytes of the ledgers compaction "
                 "replaced.", m.compaction_bytes_before),
                ("ledgerd_kafka_compaction_bytes_after", "Bytes of their replacements.",
                 m.compaction_bytes_after),
                ("ledgerd_kafka_compaction_orphans_deleted", "Ledgers a compaction pass "
                 "wrote and never listed, deleted.", m.compaction_orphans_deleted),
                ("ledgerd_kafka_compaction_sweeps", "Looks for orphaned replacements.",
                 m.compaction_sweeps)):
            yield CounterMetricFamily(name, doc, value=value)
        for name, (doc, fn) in sorted(m.counted.items()):
            yield CounterMetricFamily(name, doc, value=fn())
        for name, (doc, fn) in sorted(m.gauges.items()):
            yield GaugeMetricFamily(name, doc, value=fn())
