"""The gateway's lease on leadership (``ledgerd.kafka.lease``), driven without sockets:
a confirmation holds for the lease's duration from the time its request was sent; a
pause past it leaves the lease lapsed until ZooKeeper answers again; an answer in a
new session says the old session's state must go first."""

from __future__ import annotations

import pytest

from ledgerd.kafka.lease import Lease


def test_a_confirmation_holds_from_its_sending_time_for_the_duration() -> None:
    lease = Lease(2.0)
    assert not lease.is_valid(0.0)  # nothing confirmed yet
    assert lease.on_confirmed(session_id=7, asked_at=10.0) is False
    assert lease.is_valid(11.9) and not lease.is_valid(12.0)
    assert lease.on_confirmed(session_id=7, asked_at=9.0) is False  # an older answer
    assert lease.expires_at() == 12.0  # does not pull the lease back


def test_a_process_woken_after_a_long_stop_finds_its_lease_lapsed() -> None:
    lease = Lease(1.5, session_id=7)
    lease.on_confirmed(session_id=7, asked_at=100.0)
    assert not lease.is_valid(100.0 + 30)  # SIGSTOP for 30 s: the clock ran on


def test_an_answer_in_a_new_session_drops_the_old_state_before_leading() -> None:
    lease = Lease(1.5, session_id=7)
    lease.on_confirmed(session_id=7, asked_at=1.0)
    assert lease.on_confirmed(session_id=8, asked_at=5.0) is True  # the caller drops
    assert not lease.is_valid(5.1)  # and the lease holds only once it has
    lease.on_rebuilt(session_id=8, asked_at=5.0)
    assert lease.is_valid(5.1) and lease.session_id == 8
    assert lease.on_confirmed(session_id=8, asked_at=6.0) is False


def test_a_suspended_or_lost_session_holds_no_lease_until_confirmed_again() -> None:
    lease = Lease(10.0, session_id=7)
    lease.on_confirmed(session_id=7, asked_at=0.0)
    lease.on_suspended()
    assert not lease.is_valid(0.5)
    assert lease.on_confirmed(session_id=7, asked_at=1.0) is False  # the same session
    assert lease.is_valid(1.5)
    lease.on_lost()
    assert not lease.is_valid(1.5)
    assert lease.on_confirmed(session_id=9, asked_at=2.0) is True
    assert lease.on_confirmed(session_id=0, asked_at=3.0) is False  # no session: nothing
    assert not lease.is_valid(3.0)


def test_a_lease_needs_a_positive_duration() -> None:
    with pytest.raises(ValueError, match="positive"):
        Lease(0.0)
