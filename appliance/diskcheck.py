"""Disk checker: over ``disk_usage_threshold`` the bookie goes read-only; it comes back
only under ``disk_usage_lwm_threshold`` (hysteresis, so it does not flap).

Storage can also report a full disk itself (ENOSPC from a ledger directory that filled
faster than the checker samples): ``force_full`` makes the bookie read-only at once with
that reason, and the checker then samples every second until usage is under the
low-water mark, when the bookie is writable again."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from disk.storage import DirUsage
from ledgerd.base.logs import fields

__all__ = ["DiskChecker", "full_after"]

log = logging.getLogger(__name__)


def full_after(usage: list[DirUsage], was_full: bool, threshold: float, lwm: float) -> bool:
    """Whether the disks count as full now, given whether they did before."""
    worst = max((u.fraction for u in usage), default=0.0)
    if was_full:
        return worst >= lwm
    return worst > threshold


class DiskChecker:
    def __init__(self, usage: Callable[[], list[DirUsage]],
                 on_change: Callable[[bool, str], None], *, threshold: float, lwm: float,
                 interval_s: float) -> None:
        self.usage = usage
        self.on_change = on_change
        self.threshold = threshold
        self.lwm = lwm
        self.interval_s = interval_s
        self.full = False
        self.worst: DirUsage | None = None
        self.checks = 0
        self._forced = trio.Event()

    def force_full(self, reason: str) -> None:
        """Storage hit ENOSPC: full now; writable again only under the low-water mark."""
        self._forced.set()
        if not self.full:
            self.full = True
            log.warning("disk_full", extra=fields(reason=reason))
            self.on_change(True, reason)

    async def check(self) -> bool:
        usage = await trio.to_thread.run_sync(self.usage)
        self.checks += 1
        self.worst = max(usage, key=lambda u: u.fraction, default=None)
        full = full_after(usage, self.full, self.threshold, self.lwm)
        if full != self.full:
            self.full = full
            worst = self.worst
            reason = (f"disk {worst.path} is {worst.fraction:.1%} full "
                      f"(threshold {self.threshold:.0%}, writable again under {self.lwm:.0%})"
                      if worst else "disk usage")
            log.warning("disk_full" if full else "disk_space_back", extra=fields(
                path=str(worst.path) if worst else "", used=f"{worst.fraction:.3f}" if worst else ""))
            self.on_change(full, reason)
        return full

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.check()
        task_status.started()
        while True:
            # While full, sample at least every second, so a freed disk is seen soon.
            wait = min(self.interval_s, 1.0) if self.full else self.interval_s
            with trio.move_on_after(wait):
                await self._forced.wait()
            self._forced = trio.Event()
            await self.check()
