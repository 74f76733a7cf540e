"""When the auditor audits lost bookies: BookKeeper's rules as a pure machine, time passed in.

(BookKeeper's ``Auditor.submitAuditTask``; docs/autorecovery.md.)

- The auditor knows every bookie it has seen registered (writable or read-only; a
  read-only bookie is not lost). A membership snapshot adds new ones; if every bookie
  waiting for a delayed audit is back, that audit is cancelled (no copying).
- Bookies known but no longer registered are *lost*. With a delay of 0, or more than one
  bookie lost at once (or while another waits), the audit is due now; a single lost
  bookie is audited once ``lost_bookie_recovery_delay`` seconds have passed.
- A write to the delay node cancels a pending audit; a value of 0, or a write of the same
  value (``triggeraudit``), makes the audit due now; another value reschedules a
  pending audit with the new delay.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["AuditSchedule"]


class AuditSchedule:
    def __init__(self, known: Collection[str], delay_s: float) -> None:
        self.known: set[str] = set(known)
        self.delay_s = delay_s
        self.pending: set[str] = set()     # lost bookies waiting for the delay
        self.due_at: float | None = None   # when the next audit runs

    def on_membership(self, registered: Collection[str], now: float) -> None:
        current = set(registered)
        self.known |= current
        if self.pending and self.pending <= current:
            self.pending.clear()   # every bookie we waited for came back
            self.due_at = None
        lost = self.known - current
        if not lost:
            return
        self.known -= lost
        if self.delay_s <= 0 or len(lost) > 1 or self.pending:
            self.pending |= lost
            self.due_at = now
        elif self.due_at is None:
            self.pending |= lost
            self.due_at = now + self.delay_s

    def on_delay_written(self, delay_s: float, now: float) -> None:
        """The delay node was written (``delay_s`` is its new value)."""
        same = delay_s == self.delay_s
        self.delay_s = delay_s
        if delay_s <= 0 or same:
            self.due_at = now
        elif self.due_at is not None:
            self.due_at = now + delay_s

    def delay_audit(self, lost: Collection[str], now: float) -> None:
        """Wait the delay for ``lost`` (found missing at the auditor's start)."""
        self.pending |= set(lost)
        self.due_at = now + self.delay_s

    def audit_now(self, now: float) -> None:
        self.due_at = now

    @property
    def waiting_for_delay(self) -> bool:
        """A single lost bookie is inside its delay (periodic bookie checks skip a round)."""
        return bool(self.pending) and self.due_at is not None

    def next_deadline(self) -> float | None:
        return self.due_at

    def take_due(self, now: float) -> bool:
        """True (and the schedule cleared) if an audit is due at ``now``."""
        if self.due_at is None or self.due_at > now:
            return False
        self.due_at = None
        self.pending.clear()
        return True
