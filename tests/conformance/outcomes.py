"""What librdkafka's test-runner printed, test by test.

At its end (and again when a test times out, just before the runner kills itself) the
test-runner prints a summary table, one row per test it considered::

    |<colour> 0001_multiobj                            |     PASSED |   3.412s <clr>|
    |<colour> 0081_admin                               |     FAILED |  20.004s <clr>| <reason>
    |<colour> 0097_ssl_verify                          |    SKIPPED |   0.000s <clr>| <reason>

(``test_summary()`` in its tests/test.c). A failing test also prints, to stderr,
``### Test "NAME" failed at FILE:LINE:FUNC() at DATE: ###`` and the message on the next
line; a timed-out test's row has no reason yet when the table is printed, so the
message is taken from there.

The last row of a test wins. Rows of tests the runner did not run because of its own
filters (local-only tests under ``-L``, broker versions, scenarios) are dropped: they
are no result. ``<MAIN>``, the runner's own row, is dropped too.

The table goes to stdout, which the runner does not flush before it aborts (it aborts
at its end whenever a test failed and left client threads behind): the harness runs it
with stdout line-buffered (``stdbuf -oL``), or the table would be lost.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ROW = re.compile(r"^\|\s*(?P<name>\S+)\s*\|\s*(?P<state>[A-Z]+)\s*\|\s*(?P<secs>[0-9.]+)s\s*\|"
                 r"\s?(?P<rest>.*)$")
FAILURE = re.compile(r'^### Test "(?P<name>[^" ]+)(?: \([^"]*\))?" failed at (?P<where>.*?) ###')

# Skip reasons of the test-runner's own filters (run_tests() in tests/test.c): the test
# was not run on this set-up at all, so it has no result to compare.
NOT_RUN = ("Filtered due to negative test flags", "filtered due to test flags",
           "not applicable for broker version", "requires test scenario",
           "not included in TESTS list", "manual test", "included in TESTS_SKIP list",
           "ignoring test before TESTS_SKIP_BEFORE")


class Result(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # the test skipped itself (it needs SSL, SASL, ...)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    name: str
    result: Result
    detail: str = ""  # why it failed or skipped, as the test-runner said
    seconds: float = 0.0


SUMMARY = re.compile(r"^TEST \d+ \(.*\) SUMMARY$", re.MULTILINE)


def has_summary(text: str) -> bool:
    """Whether the test-runner printed its summary table (at its end, or at a timeout)."""
    return SUMMARY.search(ANSI.sub("", text)) is not None


def parse_output(text: str) -> dict[str, Outcome]:
    """Every test's outcome in one test-runner's output (stdout and stderr together).

    A test still RUNNING in the last table (the runner died or timed out) is FAILED.
    """
    rows: dict[str, tuple[str, float, str]] = {}
    messages: dict[str, str] = {}
    lines = ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        failed = FAILURE.match(line)
        if failed:
            message = lines[i + 1].strip() if i + 1 < len(lines) else ""
            messages.setdefault(failed["name"], message or failed["where"])
            continue
        row = ROW.match(line)
        if row and row["name"] != "<MAIN>":
            rows[row["name"]] = (row["state"], float(row["secs"]), row["rest"].strip())
    out: dict[str, Outcome] = {}
    for name, (state, secs, rest) in rows.items():
        if state == "PASSED":
            out[name] = Outcome(name=name, result=Result.PASSED, seconds=secs)
        elif state in ("FAILED", "RUNNING"):
            detail = rest or messages.get(name, "") or (
                "still running when the test-runner stopped" if state == "RUNNING" else "")
            out[name] = Outcome(name=name, result=Result.FAILED, detail=detail, seconds=secs)
        elif state == "SKIPPED":
            # A row without a reason is a test the runner's filters skipped silently
            # (another scenario), printed only because its name starts with TESTS.
            if rest and not rest.startswith(NOT_RUN):
                out[name] = Outcome(name=name, result=Result.SKIPPED, detail=rest,
                                    seconds=secs)
        # DNS (did not start) rows are not printed by the runner; nothing else exists
    return out
