"""Disk checker: per directory, over ``disk_usage_threshold`` a directory is full; it is
writable again only under ``disk_usage_lwm_threshold`` (hysteresis, so it does not
flap). A directory whose probe write fails is out of service.

The bookie goes read-only only when it cannot write at all (BookKeeper's rule): its
journal directory is full or failing, or every ledger directory is, or every index
directory is (when index directories are configured apart). Otherwise new entry logs
go to the ledger directories that have room (``on_dirs``).

Storage can also report a full disk itself (ENOSPC that came faster than the checker
samples): ``force_full`` makes the bookie read-only at once with that reason, and the
checker then samples every second until no directory it needs is full. A report about
a write that began before a check found the space back is stale: it only has the
checker sample again at once (the write is retried; if it fails again, its own report
counts): without that a
checkpoint's ENOSPC from just before an operator freed space, delivered just after the
check that saw it free, flapped a bookie writable, read-only, writable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from ledgerd.base.logs import fields
from ledgerd.disk.storage import DirUsage

__all__ = ["DiskChecker", "DiskVerdict", "disk_verdict", "full_after"]

log = logging.getLogger(__name__)


def full_after(usage: list[DirUsage], was_full: bool, threshold: float, lwm: float) -> bool:
    """Whether one directory counts as full now, given whether it did before."""
    worst = max((u.fraction for u in usage), default=0.0)
    if was_full:
        return worst >= lwm
    return worst > threshold


@dataclass(frozen=True, slots=True)
class DiskVerdict:
    full: frozenset[Path]     # over the threshold (until under the low-water mark)
    failed: frozenset[Path]   # the probe write failed
    read_only: bool
    reason: str

    @property
    def unusable(self) -> frozenset[Path]:
        return self.full | self.failed


def disk_verdict(usage: list[DirUsage], was_full: frozenset[Path], threshold: float,
                 lwm: float) -> DiskVerdict:
    full = frozenset(u.path for u in usage
                     if full_after([u], u.path in was_full, threshold, lwm))
    failed = frozenset(u.path for u in usage if u.error)
    bad = full | failed
    reasons = []
    by_role: dict[str, list[DirUsage]] = {}
    for u in usage:
        by_role.setdefault(u.role, []).append(u)
    for role, dirs in by_role.items():
        if dirs and all(u.path in bad for u in dirs):
            what = "; ".join(
                f"{u.path}: {u.error}" if u.error else
                f"{u.path} is {u.fraction:.1%} full" for u in dirs)
            plural = "directory" if len(dirs) == 1 else f"all {len(dirs)} directories"
            reasons.append(f"{role} {plural} unusable ({what}; threshold {threshold:.0%}, "
                           f"writable again under {lwm:.0%})")
    return DiskVerdict(full, failed, bool(reasons), "; ".join(reasons))


class DiskChecker:
    def __init__(self, usage: Callable[[], list[DirUsage]],
                 on_change: Callable[[bool, str], None], *, threshold: float, lwm: float,
                 interval_s: float,
                 on_dirs: Callable[[set[Path], set[Path]], None] | None = None) -> None:
        self.usage = usage
        self.on_change = on_change
        self.on_dirs = on_dirs
        self.threshold = threshold
        self.lwm = lwm
        self.interval_s = interval_s
        self.full = False  # the bookie must be read-only for its disks
        self.verdict = DiskVerdict(frozenset(), frozenset(), False, "")
        self.worst: DirUsage | None = None
        self.checks = 0
        self._forced = trio.Event()
        self._forced_reason = ""
        self._space_back_at = float("-inf")  # when the last check that found space began

    def force_full(self, reason: str, *, began: float | None = None) -> bool:
        """Storage hit ENOSPC in a write that began at ``began`` (trio time): read-only
        now; writable again once a check finds every directory it needs under the
        low-water mark. Returns False (and changes nothing) if the bookie is read-only
        for its disks already, or the write began before a check found space back."""
        if self.full:
            return False
        if began is not None and began < self._space_back_at:
            self._forced.set()  # sampled again now: a disk really full again is seen
            return False
        self._forced.set()
        self._forced_reason = reason
        self.full = True
        log.warning("disk_full", extra=fields(reason=reason))
        self.on_change(True, reason)
        return True

    async def check(self) -> bool:
        began = trio.current_time()
        usage = await trio.to_thread.run_sync(self.usage)
        self.checks += 1
        self.worst = max(usage, key=lambda u: u.fraction, default=None)
        old = self.verdict
        # After ENOSPC: every directory counts as full until under the low-water mark.
        was_full = frozenset(u.path for u in usage) if self._forced_reason else old.full
        v = disk_verdict(usage, was_full, self.threshold, self.lwm)
        self.verdict = v
        for path in sorted(v.failed - old.failed):
            log.error("directory_out_of_service", extra=fields(
                path=str(path), error=next(u.error for u in usage if u.path == path)))
        for path in sorted(old.failed - v.failed):
            log.warning("directory_back_in_service", extra=fields(path=str(path)))
        for path in sorted(v.full - old.full):
            log.warning("directory_full", extra=fields(path=str(path)))
        for path in sorted(old.full - v.full):
            log.warning("directory_space_back", extra=fields(path=str(path)))
        if self.on_dirs is not None:
            self.on_dirs(set(v.unusable), set(v.failed))
        if v.read_only != self.full or (not v.read_only and self._forced_reason):
            self.full = v.read_only
            self._forced_reason = ""
            if not v.read_only:
                self._space_back_at = began
            log.warning("disk_full" if v.read_only else "disk_space_back",
                        extra=fields(reason=v.reason))
            self.on_change(v.read_only, v.reason)
        return self.full

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.check()
        task_status.started()
        while True:
            # While full, sample at least every second, so a freed disk is seen soon.
            wait = min(self.interval_s, 1.0) if self.full or self.verdict.unusable \
                else self.interval_s
            with trio.move_on_after(wait):
                await self._forced.wait()
            self._forced = trio.Event()
            await self.check()
