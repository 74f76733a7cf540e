"""The per-test table of docs/kafka.md, generated from ``librdkafka.toml``.

The table lives between two marker lines in docs/kafka.md; ``python -m
tests.conformance.doctable`` rewrites what is between them, and a unit test fails
when the page and the list disagree, so the page cannot drift from the list.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conformance.expectations import Expected, Mode, ReasonKind, Suite, load_suite

BEGIN = "<!-- conformance table: generated from tests/conformance/librdkafka.toml -->"
END = "<!-- end of conformance table -->"
ROOT = Path(__file__).resolve().parents[2]
EXPECTATIONS = ROOT / "tests" / "conformance" / "librdkafka.toml"
PAGE = ROOT / "docs" / "kafka.md"

_KIND_TITLES = {
    ReasonKind.API: "not served yet",
    ReasonKind.HARNESS: "harness",
    ReasonKind.GATEWAY: "gateway differs from Kafka",
    ReasonKind.MACHINE: "machine",
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(suite: Suite) -> str:
    """The generated part of the page: totals, reasons, and one row per test."""
    lines: list[str] = []
    for mode in Mode:
        c = suite.counts(mode)
        total = sum(c.values())
        lines.append(f"- {mode.value} mode: {c[Expected.PASS]} of {total} tests listed as "
                     f"passing, {c[Expected.FAIL]} failing, {c[Expected.SKIP]} skipping "
                     f"themselves, {c[Expected.FLAKY]} flaky.")
    lines += ["", "| reason | kind | issue 47 item | tests (quick mode) |", "|---|---|---|---|"]
    for key, reason in suite.reasons.items():
        names = [e.name for e in suite.tests.values()
                 if e.reason is reason and e.quick is not Expected.PASS]
        item = ", ".join(map(str, reason.items))
        lines.append(f"| {_cell(reason.text)} (`{key}`) | {_KIND_TITLES[reason.kind]} | "
                     f"{item} | {', '.join(n[:4] for n in names) or '(full mode only)'} |")
    lines += ["", "| test | what it checks | quick | full | why not |", "|---|---|---|---|---|"]
    for name, e in sorted(suite.tests.items()):
        why = ""
        if e.reason is not None and {e.quick, e.full} != {Expected.PASS}:
            why = f"`{e.reason.key}`"
        if e.note:
            why = f"{why}: {_cell(e.note)}" if why else _cell(e.note)
        lines.append(f"| {name} | {_cell(e.checks)} | {e.quick.value} | {e.full.value} "
                     f"| {why} |")
    return "\n".join(lines) + "\n"


def splice(page: str, table: str) -> str:
    """``page`` with the text between the markers replaced by ``table``; raises
    ValueError when the markers are missing or out of order."""
    try:
        head, rest = page.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"the page lacks the marker lines {BEGIN!r} and {END!r}, "
                         "in that order, each on a line of its own") from None
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str]) -> int:
    """Rewrite the table in docs/kafka.md (``--check``: only say whether it is current)."""
    table = render(load_suite(EXPECTATIONS))
    page = PAGE.read_text()
    updated = splice(page, table)
    if "--check" in argv:
        if updated != page:
            print(f"{PAGE} is not current: run python -m tests.conformance.doctable",
                  file=sys.stderr)
            return 1
        return 0
    if updated != page:
        PAGE.write_text(updated)
        print(f"rewrote the conformance table in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
