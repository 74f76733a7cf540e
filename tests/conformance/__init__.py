"""librdkafka's own test suite against the Kafka gateway (``make conformance``).

librdkafka's ``tests/test-runner`` is the suite other Kafka-compatible brokers are
judged by. ``make conformance`` builds a pinned librdkafka release's test-runner
(``tests/conformance/build-librdkafka.sh``), starts a real ``ledgerd local --kafka``
cluster, runs every test of the chosen mode against its gateway and compares each
test's result with ``librdkafka.toml``, the list of what is expected to pass and why
the rest does not:

- ``expectations``: that list, loaded and checked;
- ``outcomes``: what the test-runner printed, parsed test by test;
- ``verdict``: the comparison (a listed pass that fails is a regression and fails
  the run; a listed failure that passes is reported so the list is tightened; a test
  missing from the list is an error);
- ``doctable``: the per-test table of docs/kafka.md, generated from the list;
- ``runner``: the cluster, the test-runner processes and the report.
"""
