"""The list of librdkafka tests and what each is expected to do against the gateway.

``librdkafka.toml`` holds, per test of librdkafka's suite that runs against a broker,
what it checks and its expected result in each mode (``quick``: the test-runner's
``-Q``; ``full``: without it, defaulting to the quick one):

- ``pass``: it passes; failing is a regression, and ``make conformance`` fails;
- ``fail``: it fails for the named ``reason``;
- ``skip``: the test skips itself on this set-up (it needs SSL, SASL, ...), for the reason;
- ``flaky``: it passes or fails from run to run, for the reason; neither is an error.

A test may name the ``listener`` it runs against: ``plaintext`` (the default: the
cluster every other test uses), ``ssl`` (a second cluster whose gateway listens with
TLS and requires client certificates; the test-runner gets an SSL test.conf and the
SSL_* variables librdkafka's cluster tool trivup sets) or ``sasl`` (a cluster whose
gateway requires SASL PLAIN; its test.conf has ``security.protocol=SASL_PLAINTEXT``
and the user's name and password). A test may name the ``broker_version`` it runs at
(``TEST_KAFKA_VERSION``; the share consumer's tests need 4.2.0); the others run at the
suite's. Every test of one number runs
in one test-runner process, so they all name the same listener.

A test marked ``kafka_tools = true`` runs with ``KAFKA_PATH`` (and ``BROKERS``) set: its
``bin/`` holds ``kafka-topics.sh``, ``kafka-acls.sh`` and ``kafka-configs.sh``, which
run ledgerd's own Kafka-compatible commands (``ledgerd kafka-topics`` ...) against the
gateway, where librdkafka's cluster tool gives Kafka's. Only the tests that run those
scripts get it: with ``KAFKA_PATH`` set, others run Kafka's Java programs from it
(0113's full mode), which this harness does not have.

Reasons are declared once under ``[reasons]``, each with its ``kind``, so the report
and the docs group failures by cause:

- ``api``: an API or behaviour the gateway does not serve yet, with the ``item`` of
  issue 47 that covers it (a list when it takes several; none when no item does);
- ``harness``: something this harness does not have, such as Kafka's shell tools, an
  SSL listener or a second broker;
- ``gateway``: a gateway behaviour that differs from Kafka's, not yet filed;
- ``machine``: the test's own time limits on this 2-core machine.
"""

from __future__ import annotations

import enum
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_NAME = re.compile(r"^\d{4}_[A-Za-z0-9_]+$")
VERSION = re.compile(r"^\d+\.\d+\.\d+$")


class ExpectationsError(ValueError):
    """The expectations file is malformed; the message names the file, test and key."""


class Expected(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    FLAKY = "flaky"


class Mode(enum.Enum):
    QUICK = "quick"  # test-runner -Q: fewer iterations, less data
    FULL = "full"


class Listener(enum.Enum):
    PLAINTEXT = "plaintext"  # the gateway of the cluster every other test uses
    SSL = "ssl"  # a gateway listening with TLS, client certificates required
    SASL = "sasl"  # a gateway requiring SASL PLAIN (SASL_PLAINTEXT)


class ReasonKind(enum.Enum):
    API = "api"
    HARNESS = "harness"
    GATEWAY = "gateway"
    MACHINE = "machine"


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    key: str
    kind: ReasonKind
    text: str
    # the items of issue 47 whose work should flip these tests (all of them, if several)
    items: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise ExpectationsError(f"reason {self.key!r}: empty text")
        if self.items and self.kind is not ReasonKind.API:
            raise ExpectationsError(f"reason {self.key!r}: only kind api names an issue "
                                    f"item, not kind {self.kind.value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    name: str
    checks: str
    quick: Expected
    full: Expected
    reason: Reason | None = None
    note: str = ""
    listener: Listener = Listener.PLAINTEXT
    kafka_tools: bool = False
    broker_version: str = ""  # TEST_KAFKA_VERSION for this test ("": the suite's)

    def __post_init__(self) -> None:
        if not TEST_NAME.match(self.name):
            raise ExpectationsError(f"test {self.name!r}: not a librdkafka test name "
                                    "(NNNN_name)")
        if not self.checks.strip():
            raise ExpectationsError(f"test {self.name}: `checks` is empty")
        needs_reason = {self.quick, self.full} != {Expected.PASS}
        if needs_reason and self.reason is None:
            raise ExpectationsError(f"test {self.name}: expected "
                                    f"{self.quick.value}/{self.full.value} needs a `reason`")

    def expected(self, mode: Mode) -> Expected:
        return self.quick if mode is Mode.QUICK else self.full

    @property
    def number(self) -> str:
        return self.name[:4]


@dataclass(frozen=True, slots=True, kw_only=True)
class Suite:
    """The whole file: which librdkafka it is about and every test's expectation."""

    librdkafka: str  # the release whose tests/ these are, e.g. "2.15.0"
    broker_version: str  # TEST_KAFKA_VERSION: which tests apply and what they assume
    reasons: dict[str, Reason]
    gateways: int = 1  # Kafka gateways in the cluster (brokers, each its own rack)
    tests: dict[str, Expectation] = field(default_factory=dict)

    def numbers_on(self, listener: Listener) -> set[str]:
        """The test numbers whose tests run against ``listener``."""
        return {e.number for e in self.tests.values() if e.listener is listener}

    def version_of(self, number: str) -> str:
        """TEST_KAFKA_VERSION for the tests numbered ``number``: the suite's, or the
        one those tests name (the share consumer's tests: 4.2.0, which they need)."""
        return next((e.broker_version for e in self.tests.values()
                     if e.number == number and e.broker_version), self.broker_version)

    def numbers_with_kafka_tools(self) -> set[str]:
        """The test numbers that run Kafka's shell tools (KAFKA_PATH is set for them)."""
        return {e.number for e in self.tests.values() if e.kafka_tools}

    def counts(self, mode: Mode) -> dict[Expected, int]:
        out = dict.fromkeys(Expected, 0)
        for e in self.tests.values():
            out[e.expected(mode)] += 1
        return out


_TEST_KEYS = {"checks", "quick", "full", "reason", "note", "listener", "kafka_tools",
              "broker_version"}
_REASON_KEYS = {"kind", "text", "item"}


def _enum(cls: type[enum.Enum], value: Any, where: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise ExpectationsError(f"{where}: {value!r} is not one of {choices}") from None


def _str(table: dict[str, Any], key: str, where: str, *, default: str | None = None) -> str:
    value = table.get(key, default)
    if value is None:
        raise ExpectationsError(f"{where}: `{key}` is missing")
    if not isinstance(value, str):
        raise ExpectationsError(f"{where}: `{key}` must be a string, not {value!r}")
    return value


def _bool(table: dict[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ExpectationsError(f"{where}: `{key}` must be true or false, not {value!r}")
    return value


def parse_suite(data: dict[str, Any], source: str = "<expectations>") -> Suite:
    """The Suite of a parsed TOML document; raises ExpectationsError naming the first
    thing wrong (``source`` is the file name used in messages)."""
    unknown = set(data) - {"suite", "reasons", "tests"}
    if unknown:
        raise ExpectationsError(f"{source}: unknown top-level table(s) {sorted(unknown)}")
    suite = data.get("suite")
    if not isinstance(suite, dict):
        raise ExpectationsError(f"{source}: the [suite] table is missing")
    librdkafka = _str(suite, "librdkafka", f"{source} [suite]")
    broker_version = _str(suite, "broker_version", f"{source} [suite]")
    for key, value in (("librdkafka", librdkafka), ("broker_version", broker_version)):
        if not VERSION.match(value):
            raise ExpectationsError(f"{source} [suite]: `{key}` {value!r} is not a "
                                    "version such as 2.15.0")
    gateways = suite.get("gateways", 1)
    if not isinstance(gateways, int) or isinstance(gateways, bool) or not 1 <= gateways <= 9:
        raise ExpectationsError(f"{source} [suite]: `gateways` {gateways!r} is not a "
                                "number of gateways from 1 to 9")
    reasons: dict[str, Reason] = {}
    for key, table in data.get("reasons", {}).items():
        where = f"{source} [reasons.{key}]"
        if not isinstance(table, dict):
            raise ExpectationsError(f"{where}: must be a table")
        extra = set(table) - _REASON_KEYS
        if extra:
            raise ExpectationsError(f"{where}: unknown key(s) {sorted(extra)}")
        item = table.get("item", [])
        items = item if isinstance(item, list) else [item]
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= 6
                   for i in items):
            raise ExpectationsError(f"{where}: `item` must be an item of issue 47 (0 to 6) "
                                    f"or a list of them, not {item!r}")
        reasons[key] = Reason(key=key, kind=_enum(ReasonKind, table.get("kind"), where),
                              text=_str(table, "text", where), items=tuple(items))
    tests: dict[str, Expectation] = {}
    for name, table in data.get("tests", {}).items():
        where = f"{source} [tests.{name}]"
        if not isinstance(table, dict):
            raise ExpectationsError(f"{where}: must be a table")
        extra = set(table) - _TEST_KEYS
        if extra:
            raise ExpectationsError(f"{where}: unknown key(s) {sorted(extra)}")
        quick = _enum(Expected, _str(table, "quick", where), f"{where} quick")
        full = _enum(Expected, _str(table, "full", where, default=quick.value), f"{where} full")
        reason = None
        if "reason" in table:
            key = _str(table, "reason", where)
            if key not in reasons:
                raise ExpectationsError(f"{where}: reason {key!r} is not declared under "
                                        f"[reasons] (declared: {', '.join(sorted(reasons))})")
            reason = reasons[key]
        listener = _enum(Listener, _str(table, "listener", where,
                                        default=Listener.PLAINTEXT.value), f"{where} listener")
        version = _str(table, "broker_version", where, default="")
        if version and not VERSION.match(version):
            raise ExpectationsError(f"{where}: `broker_version` {version!r} is not a "
                                    "version such as 4.2.0")
        try:
            tests[name] = Expectation(name=name, checks=_str(table, "checks", where),
                                      broker_version=version,
                                      quick=quick, full=full, reason=reason,
                                      note=_str(table, "note", where, default=""),
                                      listener=listener, kafka_tools=_bool(table, "kafka_tools",
                                                                           where))
        except ExpectationsError as exc:
            raise ExpectationsError(f"{source}: {exc}") from None
        other = next((e for e in tests.values()
                      if e.number == name[:4] and e.listener is not listener), None)
        if other is not None:
            raise ExpectationsError(
                f"{where}: listener {listener.value}, but {other.name} (the same number, "
                f"run by the same test-runner process) has listener {other.listener.value}")
    unused = set(reasons) - {e.reason.key for e in tests.values() if e.reason is not None}
    if unused:
        raise ExpectationsError(f"{source}: reason(s) no test uses: {sorted(unused)}")
    return Suite(librdkafka=librdkafka, broker_version=broker_version, reasons=reasons,
                 tests=tests, gateways=gateways)


def load_suite(path: Path) -> Suite:
    """Read and check ``path``; raises ExpectationsError (bad TOML included)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{path}: not valid TOML: {exc}") from None
    return parse_suite(data, str(path))
