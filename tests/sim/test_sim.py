"""The deterministic simulator: the protocol machines against faults, seed by seed.

``SIM_SEED=n pytest tests/sim`` replays one seed (and prints its trace tail on failure);
``SIM_SEEDS=n`` changes how many seeds the sweep runs (1000 by default), and
``SIM_TERM_SEEDS=n`` the terms sweep's (800: every term seed has a follower that holds
its metadata, so a follower reading past it shows in about one seed in 40). Wider
sweeps are for bench time: ``SIM_SEEDS=30000 pytest tests/sim``. Every run's facts go
to the one invariant checker, ``ledgerd.testing.history``.
"""

from __future__ import annotations

import os

import pytest

from tests.sim.scenario import RunResult, run_seed
from tests.sim.terms import (
    TERM_SCENARIOS,
    TermResult,
    run_late_add_scenario,
    run_recovery_change_scenario,
    run_stale_tail_scenario,
    run_term_seed,
    run_writer_change_scenario,
)
from tests.sim.world import MUTATIONS, TERM_MUTATIONS, Mutations

CI_SEEDS = int(os.environ.get("SIM_SEEDS", "1000"))
TERM_SEEDS = int(os.environ.get("SIM_TERM_SEEDS", "800"))


def _seeds() -> range | list[int]:
    if "SIM_SEED" in os.environ:
        return [int(os.environ["SIM_SEED"])]
    return range(CI_SEEDS)


def _report(r: RunResult | TermResult, mutation: str = "") -> str:
    tail = "\n".join(r.trace[-40:])
    return (f"seed {r.seed} (E/Qw/Qa={r.config}{', mutation ' + mutation if mutation else ''}) "
            f"broke an invariant: {r.violation}\nreplay: SIM_SEED={r.seed} pytest tests/sim\n"
            f"trace tail:\n{tail}")


def test_invariants_hold_for_every_seed() -> None:
    runs = closed = acked = 0
    for seed in _seeds():
        r = run_seed(seed)
        assert r.violation is None, _report(r)
        runs += 1
        closed += r.closed_at >= 0
        acked += r.acked
    # The sweep exercises something: most runs close a non-empty ledger.
    assert runs == 1 or closed > runs // 2, (closed, runs)
    assert acked > 0


def test_term_invariants_hold_for_every_seed() -> None:
    """Unbounded ledgers: successive leaders take over by raising the term."""
    seeds = [int(os.environ["SIM_SEED"])] if "SIM_SEED" in os.environ else range(TERM_SEEDS)
    runs = takeovers = acked = fragments = 0
    for seed in seeds:
        r = run_term_seed(seed)
        assert r.violation is None, _report(r)
        runs += 1
        takeovers += r.terms > 1
        acked += r.acked
        fragments += r.fragments
    # The sweep exercises something: takeovers happen, entries are acknowledged, and
    # ledgers grow fragments (failures and the fragment cap).
    assert runs == 1 or (takeovers == runs and fragments > 2 * runs), (takeovers, fragments)
    assert acked > 0


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_mutation_is_caught_within_the_ci_seeds(mutation: str) -> None:
    terms = mutation in TERM_MUTATIONS
    if terms and any(s(Mutations(**{mutation: True})).violation is not None
                     for s in TERM_SCENARIOS):
        return
    seeds = TERM_SEEDS if terms else CI_SEEDS
    for seed in range(seeds):
        run = run_term_seed if terms else run_seed
        r = run(seed, Mutations(**{mutation: True}))
        if r.violation is not None:
            return
    pytest.fail(f"mutation {mutation} survived {seeds} seeds: the checker missed a "
                f"known protocol bug")


# What each written schedule acknowledges and how many terms it reaches when it plays out.
_SCENARIO_OUTCOMES = {run_stale_tail_scenario: (10, 5), run_writer_change_scenario: (7, 3),
                      run_late_add_scenario: (7, 3), run_recovery_change_scenario: (7, 3)}
# The follower schedules: a follower that must re-read its metadata past a new LAC.
_FOLLOWER_SCENARIOS = [run_writer_change_scenario, run_late_add_scenario,
                       run_recovery_change_scenario]


@pytest.mark.parametrize("scenario", TERM_SCENARIOS, ids=lambda s: s.__name__)
def test_targeted_term_scenarios_hold_without_mutations(scenario: object) -> None:
    r = scenario()  # type: ignore[operator]
    assert r.violation is None, _report(r)
    assert (r.acked, r.terms) == _SCENARIO_OUTCOMES[scenario], (r.acked, r.terms)  # type: ignore[index]


@pytest.mark.parametrize("scenario", _FOLLOWER_SCENARIOS, ids=lambda s: s.__name__)
def test_a_follower_reading_past_its_metadata_is_caught_by_each_follower_scenario(
        scenario: object) -> None:
    """Read up to a new LAC with the fragment list held (no re-read), a follower reads
    the deposed writer's id 5 from the bookie that left its write set."""
    r = scenario(Mutations(stale_follower_reads=True))  # type: ignore[operator]
    assert r.violation == ("follower reader read id 5 as b'c1-t1-5', acknowledged as "
                           "b'c2-t3-0'"), r.violation


def test_a_follower_reading_past_its_metadata_is_found_by_random_term_seeds() -> None:
    """The term sweep finds the stale-follower bug on its own, not only through the
    written schedules."""
    mutations = Mutations(stale_follower_reads=True)
    for seed in range(TERM_SEEDS):
        if run_term_seed(seed, mutations).violation is not None:
            return
    pytest.fail(f"stale follower reads survived {TERM_SEEDS} term seeds")


def test_no_truncate_is_caught_by_the_stale_tail_scenario() -> None:
    """The mutation the random seeds miss; the written-out schedule must catch it."""
    r = TERM_SCENARIOS[0](Mutations(no_truncate=True))
    # c3 recovers c1's stale id 6 over the value c2 had acknowledged there.
    assert r.violation is not None and "acknowledged value b'c2-t3-0' at id 6" in r.violation, \
        r.violation


def test_a_seed_replays_exactly() -> None:
    a, b = run_seed(12345), run_seed(12345)
    assert (a.events, a.trace, a.closed_at, a.acked) == (b.events, b.trace, b.closed_at, b.acked)
    assert a.events > 50


def test_at_least_five_mutations_exist() -> None:
    assert len(MUTATIONS) >= 5
