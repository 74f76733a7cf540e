"""Re-replication: copy the fragments a ledger lacks, then CAS each fragment's ensemble.

The decisions are ``ledgerd.machines.checker`` (which fragments lack which bookie, which
source holds which entries) and ``ledgerd.machines.changes.replace_in_fragment`` (the
CAS); this module carries them out over the bookie pool. It serves the replication
worker (``appliance.autorecovery``) and ``ledgerd shell recover`` alike.

Per ledger (``rereplicate_ledger``):

1. Read the metadata (a deleted ledger is done) and the membership. A bookie is bad in a
   fragment when it is gone, named by the caller (``recover BOOKIE``, decommission), or
   (with ``check``) fails a probe of the first and last entry it should hold.
2. An open ledger whose last ensemble holds a bad bookie is first closed by recovery
   (fence + close) when the caller allows it (``close_open``: the worker does after its
   grace period; ``recover`` at once unless ``--skip-open``); otherwise only its final
   fragments are copied and the outcome says DEFERRED. An *unbounded* ledger is never
   closed; with ``close_open`` its open fragment is healed where it stands
   (``_heal_open``): the entries up to the highest LAC its surviving bookies hold are
   copied to a replacement and split off as a final fragment under a CAS that holds
   only while the term, the OPEN state and the writer's ensemble are as read
   (``changes.split_open_fragment``); a live writer goes on untouched. Entries above
   that LAC are in doubt (a writer that died with adds in flight: acknowledged or not,
   only recovery can tell); if they are still there, unchanged, after
   ``writer_settle_s``, the writer is taken to be dead and the ledger is taken over
   with a new term (``recovery.take_over``: term reads, rewrites at Qw, the TRUNCATE
   no-op), after which every fragment that lacks the bookie is final and is copied.
   A scrubber's report of entries missing in the open fragment
   (``holdings.reported_in_open_fragment``) puts the fragment at risk the same way:
   the reporting bookie, though alive, is healed as if it were gone (closed, or split
   off at the LAC), and until then the outcome is DEFERRED.
3. For each bad fragment: replacements by placement (never a bookie already in that
   fragment; rack-aware), or the caller's target. Each bad bookie's entries are read
   from surviving replicas in batches (one ReadRange each, digests verified, ids
   checked) and written to its replacement as multi-entry RECOVERY_ADDs, bytes
   unchanged, a bounded number of batches in flight, under an optional byte rate.
4. Once a fragment is whole on its replacements, one CAS swaps them into that
   fragment's ensemble only, re-checking that the fragment is as it was read
   (``replace_in_fragment``); if it changed, the ledger is looked at again.

5. Reported REPLICATED only when, on the metadata read after the copies, no entry is
   below Qw (``checker.entries_below_qw``: final fragments, and the open one up to the
   LAC found, counting the copies a scrubber reported missing where its bookie still
   stands); anything else is DEFERRED and looked at again.

Credentials (``Credentials``): the worker writes with the recovery credential derived
from the cluster secret (``wire.entry.recovery_key``), which bookies accept for recovery
writes and fencing only. An operator may pass the ledger's password instead.

HMAC ledgers without the password (``_Unkeyed``): their digests cannot be checked, so
each copied entry is checked for everything that needs no key (its ids, a LAC below its
id, its digest's size, the cumulative length growing by exactly its payload from the
entry before), and whenever a second surviving replica holds the same entries, the two
must agree byte for byte; a disagreement fails the copy (never a guess). A source bookie
checks its own stored CRC32C of every entry it serves, so a rotten copy on disk is an
error, not bytes. An open bounded HMAC ledger is closed by the same recovery as any
other, with those checks in place of the digest (``machines.recovery``: every replica
of an entry's write set heard, their bytes the same, lengths chained); a disagreement
fails the close and leaves the ledger IN_RECOVERY for ``recover --password``. Only a
takeover of an unbounded one needs the key (it writes the TRUNCATE no-op).
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ledgerd.base.errors import LedgerdError
from ledgerd.base.logs import fields
from ledgerd.errors import LeadershipLostError, LedgerRecoveryError, first_of
from ledgerd.machines.changes import (
    FragmentChangedError,
    replace_in_fragment,
    split_open_fragment,
)
from ledgerd.machines.checker import (
    CopyBatch,
    Fragment,
    bad_fragments,
    copy_batches,
    entries_below_qw,
    fragments,
    last_fragment_at_risk,
    probes,
    takeover_unfinished,
)
from ledgerd.machines.holdings import reported_failures, reported_in_open_fragment
from ledgerd.machines.placement import NotEnoughBookiesError, Placement, choose_replacements
from ledgerd.machines.throttle import TokenBucket
from ledgerd.machines.writer import FailureKind
from ledgerd.metadata.errors import ChangeRejectedError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.recovery import recover_ledger, take_over
from ledgerd.wire.entry import Digester, DigestType, entry_ids, master_key, recovery_key
from ledgerd.wire.entry_check import EntryCheck, KeyedCheck, UnkeyedCheck
from ledgerd.wire.errors import WireError
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    ForceLedgerRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
)
from ledgerd.wire.status import Status, UnauthorizedError

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.recovery import TakeOver

__all__ = ["CopyFailedError", "Credentials", "LedgerResult", "Outcome", "ReplicationOptions",
           "probe_failures", "rereplicate_ledger"]

log = logging.getLogger(__name__)

_RECOVERY_FLAGS = AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY
_FRAME_SLACK = 4096  # room in a frame for everything but entry bytes


class CopyFailedError(LedgerdError):
    """A fragment could not be copied (no readable replica, or the target refused)."""

    def __init__(self, ledger_id: int, reason: str, *, unreadable: bool = False) -> None:
        super().__init__(f"ledger {ledger_id}: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason
        self.unreadable = unreadable  # no surviving replica answered for some entry


@dataclass(frozen=True)
class Credentials:
    """How re-replication proves its right to write: the cluster secret (recovery
    credential per ledger) or one ledger's password."""

    cluster_secret: bytes = b""
    password: bytes | None = None

    def __post_init__(self) -> None:
        if not self.cluster_secret and self.password is None:
            raise ValueError("re-replication needs the cluster secret (cluster_secret_file) "
                             "or the ledger's password")

    def key(self, ledger_id: int) -> bytes:
        if self.password is not None:
            return master_key(self.password)
        return recovery_key(self.cluster_secret, ledger_id)

    def digester(self, ledger_id: int, md: LedgerMetadata) -> Digester:
        kind = DigestType(md.digest_type)
        if kind is DigestType.HMAC and self.password is None:
            raise CopyFailedError(
                ledger_id, "uses HMAC digests, which only its password can verify; run "
                "`ledgerd shell recover BOOKIE --ledger L --password ...`")
        return Digester(kind, self.password or b"")

    def checker(self, md: LedgerMetadata) -> EntryCheck:
        """How copied entries are checked: their digest, or (an HMAC ledger without its
        password) everything that needs no key."""
        kind = DigestType(md.digest_type)
        if kind is DigestType.HMAC and self.password is None:
            return UnkeyedCheck(kind.size)
        return KeyedCheck(Digester(kind, self.password or b""))


@dataclass(frozen=True)
class ReplicationOptions:
    batch_entries: int = 256          # entries per ReadRange / RECOVERY_ADD
    outstanding: int = 16             # batches in flight per bad bookie of a fragment
    rate_bytes: int = 0               # bytes/s per ledger copy; 0 = unlimited
    probe_concurrency: int = 16
    read_timeout: float = 10.0
    add_timeout: float = 10.0
    # An unbounded ledger's open fragment with entries above its LAC: how long they must
    # stay as they are before its writer counts as dead. A live writer's add completes
    # (its explicit LAC follows) or fails within its add timeout (add_entry_timeout_ms,
    # 5 s by default), and it then changes ensemble: the default waits that and 1 s.
    writer_settle_s: float = 6.0


class Outcome(enum.Enum):
    REPLICATED = "replicated"   # nothing bad left (maybe nothing was bad)
    DEFERRED = "deferred"       # an open ledger's last fragment lacks a bookie; not closed
    DELETED = "deleted"         # the ledger is gone: nothing to do
    SKIPPED = "skipped"         # an open ledger the caller asked to skip
    FAILED = "failed"


@dataclass
class LedgerResult:
    ledger_id: int
    outcome: Outcome = Outcome.REPLICATED
    fragments: int = 0           # fragments copied (or, dry run, to copy)
    entries: int = 0
    bytes: int = 0
    closed_by_recovery: bool = False
    unreadable: bool = False      # no surviving replica of some entry
    no_spare_bookie: bool = False  # every writable bookie is in the ensemble already
    detail: str = ""
    plan: list[dict[str, object]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"ledger_id": self.ledger_id, "outcome": self.outcome.value,
                "fragments": self.fragments, "entries": self.entries, "bytes": self.bytes,
                "closed_by_recovery": self.closed_by_recovery, "detail": self.detail,
                "plan": self.plan}


Progress = Callable[[int, int], None]  # (entries, bytes) just copied


async def rereplicate_ledger(
        client: Client, ledger_id: int, creds: Credentials,
        options: ReplicationOptions | None = None, *,
        bad_bookies: Collection[str] = (), check: bool = True, close_open: bool = False,
        skip_open: bool = False, target: str | None = None, dry_run: bool = False,
        progress: Progress | None = None,
        reported: Mapping[str, Collection[tuple[int, int]]] | None = None) -> LedgerResult:
    """Bring one ledger back to Qw copies of every entry (see the module docstring).
    ``reported``: entry ranges a bookie's scrubber found missing there (from the
    queue record); the fragments they fall in are copied as if a probe had failed."""
    opts = options or ReplicationOptions()
    result = LedgerResult(ledger_id)
    settled = -1  # the end of a takeover this call made: nothing up to it is in doubt
    for _attempt in range(5):
        result.outcome = Outcome.REPLICATED
        result.detail = ""
        try:
            md, _ = await client.ledgers.read(ledger_id)
        except NoNodeError:
            result.outcome = Outcome.DELETED
            return result
        members = await client.registry.list_bookies()  # fresh, not the watch's last view
        available = set(members.all) - set(bad_bookies)
        if skip_open and not md.is_closed and any(
                b in bad_bookies for _, ens in md.ensembles for b in ens):
            result.outcome = Outcome.SKIPPED
            result.detail = "open ledger skipped"
            return result
        known_lac = -1  # the open fragment's entries known acknowledged
        failed: set[tuple[int, int]] = set()
        # A scrubber's report in the open fragment is a lost copy there: healed as for
        # a lost bookie (closed, or split at the LAC), never left for "later".
        open_lacking = reported_in_open_fragment(md, reported or {})
        at_risk = last_fragment_at_risk(md, available) or bool(open_lacking)
        try:
            if at_risk and md.unbounded:
                # Never closed: its writer's next add moves the last fragment; after
                # the grace period the acknowledged part is healed where it stands.
                if not close_open:
                    result.outcome = Outcome.DEFERRED
                    result.detail = "unbounded ledger: its writer may still move its last " \
                                    "fragment"
                elif dry_run:
                    result.plan.append({"action": "heal the open fragment up to its LAC"})
                else:
                    healed = await _heal_open(client, ledger_id, md, available, creds, opts,
                                              target, result, progress,
                                              lacking=open_lacking, settled=settled)
                    if not isinstance(healed, int):
                        # Taken over with a new term: everything up to its no-op is
                        # settled, and the fragments that lost a bookie are final.
                        settled = healed.last_entry_id
                        continue
                    known_lac = healed
            elif at_risk:
                if not close_open:
                    result.outcome = Outcome.DEFERRED
                elif dry_run:
                    result.plan.append({"action": "fence and close (recovery)"})
                else:
                    try:
                        md = await _close(client, ledger_id, md, creds, opts)
                        result.closed_by_recovery = True
                    except LedgerRecoveryError as exc:
                        if exc.kind is not FailureKind.CORRUPT:
                            raise
                        # Only the password can settle it: the finished fragments are
                        # copied meanwhile, and the ledger stays FAILED.
                        result.outcome = Outcome.FAILED
                        result.detail = str(exc)
                        md, _ = await client.ledgers.read(ledger_id)
            if check:
                failed = await probe_failures(client, ledger_id, md, available, opts)
            failed |= reported_failures(md, reported or {})
            bad = bad_fragments(md, available, failed)
            for frag in fragments(md):
                if frag.first in bad:
                    await _repair_fragment(client, ledger_id, md, frag, bad[frag.first],
                                           creds, opts, target, dry_run, result, progress)
        except FragmentChangedError as exc:
            log.info("rereplication_fragment_changed", extra=fields(
                ledger=ledger_id, reason=str(exc)))
            continue  # look at the ledger again
        except LeadershipLostError as exc:
            log.info("rereplication_term_changed", extra=fields(
                ledger=ledger_id, reason=str(exc)))
            continue  # a writer took the ledger over meanwhile: look again
        except NoNodeError:
            result.outcome = Outcome.DELETED
            return result
        except (CopyFailedError, NotEnoughBookiesError, LedgerRecoveryError,
                UnauthorizedError, ChangeRejectedError) as exc:
            result.outcome = Outcome.FAILED
            result.unreadable = isinstance(exc, CopyFailedError) and exc.unreadable
            result.no_spare_bookie = isinstance(exc, NotEnoughBookiesError) and exc.excluded > 0
            result.detail = str(exc)
            return result
        if result.outcome is Outcome.REPLICATED and not dry_run:
            await _confirm_whole(client, ledger_id, bad_bookies, known_lac, result,
                                 reported or {})
        return result
    result.outcome = Outcome.FAILED
    result.detail = "the ledger's metadata kept changing under the copy"
    return result


async def _confirm_whole(client: Client, ledger_id: int, bad_bookies: Collection[str],
                         known_lac: int, result: LedgerResult,
                         reported: Mapping[str, Collection[tuple[int, int]]]) -> None:
    """REPLICATED stays only if the metadata as it is now has no entry below Qw (a
    writer may have ended a fragment on the lost bookie meanwhile), counting the copies
    a scrubber reported missing where that bookie still stands (the open fragment's
    too); else DEFERRED."""
    try:
        md, _ = await client.ledgers.read(ledger_id)
    except NoNodeError:
        result.outcome = Outcome.DELETED
        return
    members = await client.registry.list_bookies()
    lacking = reported_failures(md, reported, open_fragment=True)
    if not md.is_closed and any(f == md.last_ensemble[0] for f, _ in lacking):
        # A scrubber reports only entries up to a LAC it knew: acknowledged, so the
        # open fragment counts at least that far.
        known_lac = max([known_lac, *(b for ranges in reported.values() for _, b in ranges)])
    below = entries_below_qw(md, set(members.all) - set(bad_bookies), known_lac, lacking)
    if below:
        count = sum(b - a + 1 for a, b in below)
        result.outcome = Outcome.DEFERRED
        result.detail = f"{count} entries still below Qw (first {below[0][0]}); looked " \
                        "at again"


async def _heal_open(client: Client, ledger_id: int, md: LedgerMetadata,
                     available: Collection[str], creds: Credentials,
                     opts: ReplicationOptions, target: str | None, result: LedgerResult,
                     progress: Progress | None, *, lacking: Collection[int] = (),
                     settled: int = -1) -> int | TakeOver:
    """Heal an unbounded ledger's open fragment (see the module docstring): returns the
    LAC it is healed up to, or the TakeOver once the ledger was taken over with a new
    term (look again). ``lacking``: indexes whose bookie, though available, was
    reported missing entries there (healed as if gone); ``settled``: an entry known
    acknowledged (a takeover's no-op) whatever the bookies' LACs say. Raises
    FragmentChangedError when its writer moved meanwhile."""
    first, ensemble = md.last_ensemble
    bad = {i for i, b in enumerate(ensemble) if b not in available} | set(lacking)
    check = creds.checker(md)
    if takeover_unfinished(md):
        # A takeover raised the term and never opened it (the bookies refused it, or
        # its leader died or was cancelled mid-way). Terms never go back, and no writer
        # can change this ledger until someone takes it over again, so no split can
        # land: once it has stayed so for the settle time, take it over (as the next
        # leader would; it raises the term again and opens it).
        await trio.sleep(opts.writer_settle_s)
        now, _ = await client.ledgers.read(ledger_id)
        if now.ensembles != md.ensembles or now.term != md.term or now.state != md.state:
            raise FragmentChangedError("the takeover in progress moved on")
        return await _take_over(client, ledger_id, md, creds, opts, result,
                                why=f"left IN_RECOVERY at term {md.term}")

    async def read_lac() -> tuple[int, int]:
        lac, top = await _open_lac(client, ledger_id, ensemble, bad, check, opts)
        lac = max(lac, settled) if settled >= first else lac
        return lac, max(top, lac)

    lac, top = await read_lac()
    if top > lac:
        # Entries above every LAC a bookie holds: a writer with adds in flight, or one
        # that died with them. Give a live one the time to finish or move.
        await trio.sleep(opts.writer_settle_s)
        now, _ = await client.ledgers.read(ledger_id)
        if now.ensembles != md.ensembles or now.term != md.term or now.state != md.state:
            raise FragmentChangedError("the writer moved its last fragment")
        again = await read_lac()
        if again == (lac, top):
            if not check.keyed:
                # Without the password no no-op can be written: the in-doubt entries
                # wait for the next leader's takeover; the acknowledged part is healed.
                result.outcome = Outcome.DEFERRED
                result.detail = (f"entries {lac + 1}..{top} of the open fragment are above "
                                 "its LAC and its writer is silent; an HMAC ledger is taken "
                                 "over only with its password")
            else:
                return await _take_over(client, ledger_id, md, creds, opts, result,
                                        why=f"entries {lac + 1}..{top} in doubt")
        lac = again[0]
    if lac >= first:
        frag = Fragment(first, lac, ensemble, True)
        outcome = result.outcome
        await _repair_fragment(
            client, ledger_id, md, frag, bad, creds, opts, target, False, result, progress,
            cas=lambda moves: lambda cur: split_open_fragment(cur, first, lac, moves, md.term))
        result.outcome = outcome
        log.info("open_fragment_healed", extra=fields(ledger=ledger_id, first=first, lac=lac))
    return lac


async def _take_over(client: Client, ledger_id: int, md: LedgerMetadata, creds: Credentials,
                     opts: ReplicationOptions, result: LedgerResult, *, why: str
                     ) -> int | TakeOver:
    """Take an unbounded ledger over with a new term (its writer is taken to be dead);
    an HMAC ledger without the password cannot be (DEFERRED, the LAC -1 healed)."""
    if not creds.checker(md).keyed:
        # Without the password no no-op can be written: the in-doubt entries wait for
        # the next leader's takeover; the acknowledged part is healed.
        result.outcome = Outcome.DEFERRED
        result.detail = (f"the open fragment needs a takeover ({why}) and an HMAC ledger "
                         "is taken over only with its password")
        return -1
    log.warning("rereplication_taking_over", extra=fields(ledger=ledger_id, term=md.term,
                                                          reason=why))
    took = await take_over(client.ledgers, client.pool, ledger_id, creds.key(ledger_id),
                           creds.digester(ledger_id, md), read_timeout=opts.read_timeout,
                           add_timeout=opts.add_timeout, writable=client.writable_bookies,
                           rng=client.rng)
    result.closed_by_recovery = True
    return took


async def _open_lac(client: Client, ledger_id: int, ensemble: tuple[str, ...],
                    bad: Collection[int], check: EntryCheck,
                    opts: ReplicationOptions) -> tuple[int, int]:
    """``(lac, highest entry)`` over the surviving bookies of the open fragment: the
    highest LAC any of them holds (explicit, or carried by its last entry) and its
    highest entry. Raises CopyFailedError unless every one of them answers."""
    lac = top = -1
    errors: list[str] = []

    async def one(bookie: str) -> None:
        nonlocal lac, top
        status, resp, error = await client.pool.call(
            bookie, ReadLacRequest(ledger_id=ledger_id), opts.read_timeout)
        if status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY) and error is None:
            return
        if status != Status.OK or not isinstance(resp, ReadLacResponse):
            errors.append(f"{bookie}: {error or _status_name(status)}")
            return
        try:
            if resp.explicit_lac:
                lac = max(lac, check.lac_body(resp.explicit_lac, ledger_id))
            if resp.last_entry:
                eid = entry_ids(resp.last_entry)[1]
                entry_lac, _ = check.entry(resp.last_entry, ledger_id, eid)
                lac, top = max(lac, entry_lac), max(top, eid)
        except (WireError, struct.error) as exc:
            errors.append(f"{bookie}: {exc}")

    async with trio.open_nursery() as nursery:
        for i, bookie in enumerate(ensemble):
            if i not in bad:
                nursery.start_soon(one, bookie)
    if errors:
        raise CopyFailedError(ledger_id, "the open fragment's LAC could not be read from "
                              f"every surviving bookie ({'; '.join(errors)})")
    return lac, max(top, lac)


async def _close(client: Client, ledger_id: int, md: LedgerMetadata, creds: Credentials,
                 opts: ReplicationOptions) -> LedgerMetadata:
    """Fence and close an open ledger (its writer, if alive, sees FENCED). An HMAC
    ledger without its password is recovered with the checks that need no key and
    replicas that must agree (``machines.recovery``); raises LedgerRecoveryError
    (CORRUPT) if they do not, and the ledger stays IN_RECOVERY for its password."""
    check = creds.checker(md)
    log.info("rereplication_closing_open_ledger", extra=fields(
        ledger=ledger_id, ensemble=",".join(md.last_ensemble[1]), keyed=check.keyed))
    try:
        closed, _ = await recover_ledger(
            client.ledgers, client.pool, ledger_id, creds.key(ledger_id), check,
            read_timeout=opts.read_timeout, add_timeout=opts.add_timeout,
            writable=client.writable_bookies, rng=client.rng)
    except LedgerRecoveryError as exc:
        if exc.kind is not FailureKind.CORRUPT:
            raise
        log.error("rereplication_close_refused", extra=fields(
            ledger=ledger_id, reason=exc.reason, left="IN_RECOVERY",
            fix="ledgerd shell recover BOOKIE --ledger L --password P"))
        raise LedgerRecoveryError(
            ledger_id, f"{exc.reason}; nothing unvouched was rewritten and the ledger "
            "stays IN_RECOVERY (fenced) until a recovery with its password closes it: "
            f"`ledgerd shell recover BOOKIE --ledger {ledger_id} --password ...`",
            kind=exc.kind) from exc
    return closed


async def probe_failures(client: Client, ledger_id: int, md: LedgerMetadata,
                         available: Collection[str], opts: ReplicationOptions,
                         bucket: TokenBucket | None = None) -> set[tuple[int, int]]:
    """The (fragment, index) pairs whose bookie did not answer OK for the first or last
    entry it should hold (``checker.probes``); ``bucket`` paces the reads."""
    failed: set[tuple[int, int]] = set()
    limit = trio.Semaphore(opts.probe_concurrency)

    async def one(first: int, index: int, bookie: str, entry: int) -> None:
        async with limit:
            if bucket is not None:
                wait = bucket.take(trio.current_time())
                if wait:
                    await trio.sleep(wait)
            status, _, _ = await client.pool.call(bookie, ReadRequest(
                ledger_id=ledger_id, entry_id=entry), opts.read_timeout)
        if status != Status.OK:
            failed.add((first, index))

    async with trio.open_nursery() as nursery:
        for p in probes(md, available):
            for entry in p.entries:
                nursery.start_soon(one, p.first, p.index, p.bookie, entry)
    return failed


async def _repair_fragment(client: Client, ledger_id: int, md: LedgerMetadata,
                           frag: Fragment, bad: set[int], creds: Credentials,
                           opts: ReplicationOptions, target: str | None, dry_run: bool,
                           result: LedgerResult, progress: Progress | None,
                           cas: Callable[[dict[int, tuple[str, str]]],
                                         Callable[[LedgerMetadata], LedgerMetadata]]
                           | None = None) -> None:
    # Fresh from ZooKeeper (a long-running worker must not trust a watch it may have
    # lost with a session), with the rack labels.
    members = await client.registry.list_bookies(with_racks=True)
    writable = set(members.writable)
    if target is not None:
        if target in frag.ensemble:
            raise CopyFailedError(ledger_id, f"target {target} is already in the fragment at "
                                  f"entry {frag.first}")
        if len(bad) > 1:
            raise CopyFailedError(ledger_id, f"fragment at entry {frag.first} lacks "
                                  f"{len(bad)} bookies; one --target cannot replace them all")
        new = tuple(target if i in bad else b for i, b in enumerate(frag.ensemble))
    else:
        new = choose_replacements(writable, frag.ensemble, bad, client.rng,
                                  write_quorum=md.write_quorum,
                                  placement=Placement(members.racks))
    moves = {i: (frag.ensemble[i], new[i]) for i in sorted(bad)}
    if dry_run:
        result.fragments += 1
        result.plan.append({"fragment": [frag.first, frag.last],
                            "replace": {old: nb for old, nb in moves.values()}})
        return
    check = creds.checker(md)
    key = creds.key(ledger_id)
    await _check_credential(client, ledger_id, frag, bad, key, opts)
    try:
        async with trio.open_nursery() as nursery:
            for index, (_old, nb) in moves.items():
                batches = copy_batches(frag, index, md.ensemble_size, md.write_quorum, bad,
                                       opts.batch_entries)
                nursery.start_soon(_copy, client, ledger_id, batches, nb, key, check,
                                   opts, result, progress, md.term)
    except BaseExceptionGroup as group:  # each copy task stops at its first failure
        raise (first_of(group, CopyFailedError) or group) from None
    change = cas(moves) if cas is not None else (
        lambda cur: replace_in_fragment(cur, frag.first, frag.last, moves))
    await client.ledgers.update(ledger_id, change)
    result.fragments += 1
    log.info("fragment_rereplicated", extra=fields(
        ledger=ledger_id, first=frag.first, last=frag.last,
        replaced=",".join(f"{o}->{n}" for o, n in moves.values())))


async def _check_credential(client: Client, ledger_id: int, frag: Fragment, bad: set[int],
                            key: bytes, opts: ReplicationOptions) -> None:
    """Ask a surviving replica whether it accepts ``key`` for this ledger (ForceLedger,
    which changes nothing): a target that never saw the ledger accepts any key, so a
    wrong credential must be caught where the ledger's key is known."""
    for i, bookie in enumerate(frag.ensemble):
        if i in bad:
            continue
        status, _, error = await client.pool.call(
            bookie, ForceLedgerRequest(ledger_id=ledger_id, master_key=key), opts.add_timeout)
        if status == Status.UNAUTHORIZED:
            raise CopyFailedError(ledger_id, f"{bookie} refused the recovery credential (is "
                                  "the same cluster_secret_file configured on every bookie "
                                  "and autorecovery process?)")
        if error is None and status == Status.OK:
            return


async def _copy(client: Client, ledger_id: int, batches: list[CopyBatch], target: str,
                key: bytes, check: EntryCheck, opts: ReplicationOptions,
                result: LedgerResult, progress: Progress | None, term: int = 0) -> None:
    """Copy ``batches`` to ``target``: at most ``opts.outstanding`` in flight (writes
    carry the ledger's ``term``)."""
    bucket = TokenBucket(opts.rate_bytes, burst=max(opts.rate_bytes, 1 << 20),
                         now=trio.current_time()) if opts.rate_bytes > 0 else None
    limit = trio.Semaphore(opts.outstanding)
    max_frame = client.pool.options.max_frame_bytes

    async def one(batch: CopyBatch) -> None:
        try:
            entries = await _read_batch(client, ledger_id, batch, check, opts, max_frame)
            size = sum(len(e) for e in entries)
            if bucket is not None:
                wait = bucket.take(trio.current_time(), size)
                if wait:
                    await trio.sleep(wait)
            await _write(client, ledger_id, batch.first, entries, target, key, opts, max_frame,
                         term=term)
        finally:
            limit.release()
        result.entries += len(entries)
        result.bytes += size
        if progress is not None:
            progress(len(entries), size)

    async with trio.open_nursery() as nursery:
        for batch in batches:
            await limit.acquire()
            nursery.start_soon(one, batch)


async def _read_batch(client: Client, ledger_id: int, batch: CopyBatch, check: EntryCheck,
                      opts: ReplicationOptions, max_frame: int) -> list[bytes]:
    """Entries ``batch.first..batch.last``, each checked, from the first source that has
    them (a source may answer part of the range; the rest is asked again). Unkeyed
    (HMAC without the password): a second source that holds them must agree."""
    out: list[bytes] = []
    reasons: list[str] = []
    sources = client.pool.order_replicas(batch.sources)
    si = 0
    used: list[str] = []
    while batch.first + len(out) <= batch.last:
        if si >= len(sources):
            e = batch.first + len(out)
            raise CopyFailedError(ledger_id, f"entry {e}: no surviving replica could be "
                                  f"read ({'; '.join(reasons) or 'no replica'})",
                                  unreadable=True)
        source = sources[si]
        e = batch.first + len(out)
        got, reason = await _read_from(client, ledger_id, source, e, batch.last, check, opts,
                                       max_frame)
        out.extend(got)
        if got:
            used.append(source)
        if reason is not None or not got:
            reasons.append(reason or f"{source}: no entries")
            si += 1
    if not check.keyed:
        for other in sources:
            if other in used:
                continue
            theirs, _ = await _read_from(client, ledger_id, other, batch.first, batch.last,
                                         check, opts, max_frame)
            for i, data in enumerate(theirs):
                if bytes(data) != bytes(out[i]):
                    raise CopyFailedError(ledger_id, f"entry {batch.first + i}: replicas "
                                          f"{used[0]} and {other} hold different bytes, and "
                                          "without the password neither can be verified")
            if theirs:
                break
    return out


async def _read_from(client: Client, ledger_id: int, source: str, first: int, last: int,
                     check: EntryCheck, opts: ReplicationOptions, max_frame: int,
                     ) -> tuple[list[bytes], str | None]:
    """The checked entries ``first..`` that ``source`` answers with (one ReadRange; maybe
    fewer than asked), and why it failed (None if it did not)."""
    status, resp, error = await client.pool.call(source, ReadRangeRequest(
        ledger_id=ledger_id, first_entry_id=first, max_count=last - first + 1,
        max_bytes=max_frame - _FRAME_SLACK), opts.read_timeout)
    if status != Status.OK or not isinstance(resp, ReadRangeResponse) or not resp.entries:
        if error is not None:
            client.pool.note_failure(source)
        return [], f"{source}: {error or _status_name(status)}"
    out: list[bytes] = []
    previous: int | None = None
    try:
        for i, data in enumerate(resp.entries[: last - first + 1]):
            _, previous = check.entry(data, ledger_id, first + i, previous)
            out.append(data)
    except WireError as exc:
        log.warning("rereplication_bad_replica", extra=fields(
            ledger=ledger_id, bookie=source, error=str(exc)))
        return out, f"{source}: {exc}"
    return out, None  # maybe fewer than asked (max_bytes): the rest is asked again


async def _write(client: Client, ledger_id: int, first: int, entries: list[bytes],
                 target: str, key: bytes, opts: ReplicationOptions, max_frame: int, *,
                 term: int = 0) -> None:
    """RECOVERY_ADDs of ``entries`` to ``target``, as few frames as fit (carrying the
    ledger's term: a bookie refuses term 0 on an unbounded ledger)."""
    start = 0
    while start < len(entries):
        end, size = start, 0
        while end < len(entries) and (end == start or
                                      size + len(entries[end]) <= max_frame - _FRAME_SLACK):
            size += len(entries[end])
            end += 1
        status, _, error = await client.pool.call(target, AddRequest(
            ledger_id=ledger_id, first_entry_id=first + start, flags=_RECOVERY_FLAGS,
            master_key=key, term=term, entries=tuple(entries[start:end])), opts.add_timeout)
        if status != Status.OK:
            if status == Status.UNAUTHORIZED:
                reason = (f"{target} refused the recovery credential (is the same "
                          "cluster_secret_file configured on every bookie?)")
            else:
                reason = f"{target} did not store entries {first + start}..{first + end - 1}: " \
                         f"{error or _status_name(status)}"
            raise CopyFailedError(ledger_id, reason)
        start = end


def _status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"status {status}"


def summarize(results: Mapping[int, LedgerResult]) -> dict[str, int]:
    """Counts per outcome, for progress lines and --json."""
    out: dict[str, int] = {}
    for r in results.values():
        out[r.outcome.value] = out.get(r.outcome.value, 0) + 1
    return out
