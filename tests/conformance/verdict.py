"""A run's outcomes against the expectations: what fails the run and what to tighten.

- a **regression**: a test listed ``pass`` that failed, skipped itself or gave no result;
  the run fails;
- a **surprise**: a test listed ``fail`` or ``skip`` that passed; reported, so the
  list is tightened (the run does not fail: the gateway got better);
- a **changed failure**: listed ``fail`` but skipped itself, or listed ``skip`` but
  failed; the run fails, as the list no longer says why the test does not pass;
- an **unlisted** test: it ran (any result) and is not in the list; the run fails;
- a **silent** test: listed, but the test-runner said nothing of it although its
  number was run (removed or renamed in this librdkafka, or filtered out here); the
  run fails. When the test-runner process of a number died before its summary, its
  listed tests without a result are taken as failed instead (a regression for those
  listed ``pass``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.conformance.expectations import Expected, Mode, Suite
from tests.conformance.outcomes import Outcome, Result

_MATCHES = {
    Expected.PASS: {Result.PASSED},
    Expected.FAIL: {Result.FAILED},
    Expected.SKIP: {Result.SKIPPED},
    Expected.FLAKY: {Result.PASSED, Result.FAILED},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    name: str
    expected: Expected | None  # None: the test is not listed
    outcome: Outcome | None  # None: no result for it
    detail: str = ""

    def describe(self) -> str:
        got = self.outcome.result.value if self.outcome else "no result"
        why = self.detail or (self.outcome.detail if self.outcome else "")
        listed = self.expected.value if self.expected else "unlisted"
        return f"{self.name}: listed {listed}, got {got}" + (f" ({why})" if why else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    mode: Mode
    outcomes: dict[str, Outcome]
    as_listed: list[str] = field(default_factory=list)
    regressions: list[Finding] = field(default_factory=list)
    surprises: list[Finding] = field(default_factory=list)
    changed: list[Finding] = field(default_factory=list)
    unlisted: list[Finding] = field(default_factory=list)
    silent: list[Finding] = field(default_factory=list)

    @property
    def is_ok(self) -> bool:
        """True unless something listed here fails the run (surprises do not)."""
        return not (self.regressions or self.changed or self.unlisted or self.silent)

    def count(self, result: Result) -> int:
        return sum(1 for o in self.outcomes.values() if o.result is result)


def judge(suite: Suite, mode: Mode, outcomes: Mapping[str, Outcome],
          numbers_run: Iterable[str], died: Mapping[str, str] | None = None) -> Verdict:
    """Compare ``outcomes`` with ``suite`` for the tests whose number is in
    ``numbers_run`` (``"0001"``; a run of a subset judges only those).

    ``died`` maps a number to why its test-runner process ended without a full summary
    (a crash, the harness's own time limit): its listed tests without a result are
    taken as failed for that reason, not as silent.
    """
    numbers = set(numbers_run)
    died = dict(died or {})
    got = {name: o for name, o in outcomes.items() if name[:4] in numbers}
    silent: list[Finding] = []
    for name, expectation in sorted(suite.tests.items()):
        if expectation.number not in numbers or name in got:
            continue
        if expectation.number in died:
            got[name] = Outcome(name=name, result=Result.FAILED,
                                detail=died[expectation.number])
        else:
            silent.append(Finding(name=name, expected=expectation.expected(mode),
                                  outcome=None, detail="the test-runner did not report it"))
    verdict = Verdict(mode=mode, outcomes=got, silent=silent)
    for name, outcome in sorted(got.items()):
        expectation = suite.tests.get(name)
        if expectation is None:
            verdict.unlisted.append(Finding(name=name, expected=None, outcome=outcome))
            continue
        expected = expectation.expected(mode)
        finding = Finding(name=name, expected=expected, outcome=outcome)
        if outcome.result in _MATCHES[expected]:
            verdict.as_listed.append(name)
        elif expected is Expected.PASS:
            verdict.regressions.append(finding)
        elif outcome.result is Result.PASSED:
            verdict.surprises.append(finding)
        else:
            verdict.changed.append(finding)
    return verdict
