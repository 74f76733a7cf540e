"""The client's own metrics, exported when the application asks for them.

``collector = client.metrics_collector()`` (or ``SyncClient.metrics_collector()``)
returns a Prometheus collector; register it where the application's metrics live
(``prometheus_client.REGISTRY.register(collector)``). Asking turns the latency
histograms on; until then the client pays for no observation. Families:

- ``ledgerd_client_add_latency_seconds``: submit to durable on the ack quorum;
- ``ledgerd_client_read_latency_seconds``: one read batch (a window of ``read``);
- ``ledgerd_client_adds_total{outcome="ok"|"failed"}``;
- ``ledgerd_client_outstanding_appends``: appends submitted and not yet completed;
- ``ledgerd_client_ensemble_changes_total``: bookies replaced under writers.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ledgerd.base.histogram import LATENCY_BUCKETS, FastHistogram

__all__ = ["ClientMetrics"]


class ClientMetrics:
    """Counters of one client; the histograms count only once ``enabled``."""

    def __init__(self) -> None:
        self.enabled = False
        self.add_latency = FastHistogram(LATENCY_BUCKETS)
        self.read_latency = FastHistogram(LATENCY_BUCKETS)
        self.adds_ok = 0
        self.adds_failed = 0
        self.outstanding = 0
        self.ensemble_changes = 0

    def collector(self) -> ClientMetrics:
        """This object as a Prometheus collector (``collect``), and turned on."""
        self.enabled = True
        return self

    def collect(self) -> Iterator[Metric]:
        yield self.add_latency.family("ledgerd_client_add_latency_seconds",
                                      "Append latency: submit to durable on the ack quorum.")
        yield self.read_latency.family("ledgerd_client_read_latency_seconds",
                                       "Read batch latency (one window of read()).")
        adds = CounterMetricFamily("ledgerd_client_adds", "Appends completed, by outcome.",
                                   labels=["outcome"])
        adds.add_metric(["ok"], self.adds_ok)
        adds.add_metric(["failed"], self.adds_failed)
        yield adds
        yield GaugeMetricFamily("ledgerd_client_outstanding_appends",
                                "Appends submitted and not yet completed.",
                                value=self.outstanding)
        yield CounterMetricFamily("ledgerd_client_ensemble_changes",
                                  "Bookies replaced under this client's writers.",
                                  value=self.ensemble_changes)
