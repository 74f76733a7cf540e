"""Underreplication queue, replication locks, the autorecovery switch and auditor election.

Layout under ``<root>/underreplication`` (BookKeeper's):

- ``ledgers/<4 x %04x>/urL%010d``: one node per underreplicated ledger, JSON
  ``{"format": 1, "missing_replicas": [...], "ctime_ms": ...}``, plus
  ``"missing_entries": {bookie: [[first, last], ...]}`` when a bookie's scrubber found
  entries missing there (ranges of entry ids; older readers ignore the key);
- ``locks/urL%010d``: ephemeral; its holder is the one worker re-replicating the ledger;
- ``disable``: present means autorecovery is off;
- ``auditorelection/V_<seq>``: ephemeral-sequential candidates; the lowest is the
  auditor; every other candidate watches only its predecessor (no herd on hand-over);
- ``lostBookieRecoveryDelay``: seconds, as text; the auditor creates it from its config
  when absent and watches it; rewriting the same value triggers an audit at once;
- ``checkallledgersctime``, ``bookiecheckctime``: ms of the last completed periodic
  check, so a newly elected auditor does not postpone a due check.

A worker locks a ledger by creating ``locks/urL…`` and remembers the record's version;
it deletes the record with that version once done, so a ledger re-marked meanwhile
(the version moved) stays queued and is looked at again.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import (
    BadVersionError,
    CorruptMetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from ledgerd.metadata.paths import underreplicated_path
from ledgerd.metadata.store import MetadataStore, WatchKind

__all__ = ["AuditorElection", "UnderreplicatedLedger", "UnderreplicationManager"]


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    ctime_ms: int
    # bookie -> ranges (first, last) of entry ids its scrubber found missing there
    missing_entries: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


MAX_RANGES_PER_BOOKIE = 4096  # a record stays far below ZooKeeper's 1 MB node limit


def _merge_ranges(*groups: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The union of ranges, sorted, touching ones joined, at most
    MAX_RANGES_PER_BOOKIE (the closest are joined first: an overestimate, never less)."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(r for g in groups for r in g):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    while len(merged) > MAX_RANGES_PER_BOOKIE:
        gaps = min(range(len(merged) - 1), key=lambda i: merged[i + 1][0] - merged[i][1])
        merged[gaps:gaps + 2] = [(merged[gaps][0], merged[gaps + 1][1])]
    return tuple(merged)


def _decode(raw: bytes, path: str) -> UnderreplicatedLedger:
    try:
        doc = json.loads(raw)
        lid = int(path.rsplit("urL", 1)[1])
        entries = {str(b): tuple((int(a), int(z)) for a, z in ranges)
                   for b, ranges in doc.get("missing_entries", {}).items()}
        return UnderreplicatedLedger(lid, tuple(str(b) for b in doc["missing_replicas"]),
                                     int(doc["ctime_ms"]), entries)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CorruptMetadataError(path, f"not an underreplication record: {exc}") from exc


def _encode(rec: UnderreplicatedLedger) -> bytes:
    doc: dict[str, object] = {"format": 1, "missing_replicas": sorted(rec.missing_replicas),
                              "ctime_ms": rec.ctime_ms}
    if rec.missing_entries:
        doc["missing_entries"] = {b: [list(r) for r in ranges]
                                  for b, ranges in sorted(rec.missing_entries.items())}
    return json.dumps(doc).encode()


class UnderreplicationManager:
    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.base = f"{root}/underreplication"
        self.root = root

    async def mark_underreplicated(
            self, ledger_id: int, missing: list[str],
            entries: Mapping[str, Iterable[tuple[int, int]]] | None = None) -> None:
        """Add ``missing`` replicas to the ledger's record (created if absent), and
        ``entries``: bookie to ranges of entry ids found missing there (a scrubber's)."""
        path = underreplicated_path(self.root, ledger_id)
        found = {b: _merge_ranges(r) for b, r in (entries or {}).items()}
        missing = sorted(set(missing) | set(found))
        rec = UnderreplicatedLedger(ledger_id, tuple(sorted(set(missing))),
                                    int(time.time() * 1000), found)
        try:
            await self.store.create(path, _encode(rec), make_parents=True)
            return
        except NodeExistsError:
            pass

        def merge(cur: UnderreplicatedLedger) -> UnderreplicatedLedger:
            both = {b: _merge_ranges(cur.missing_entries.get(b, ()), found.get(b, ()))
                    for b in set(cur.missing_entries) | set(found)}
            return UnderreplicatedLedger(ledger_id, tuple(sorted(set(cur.missing_replicas)
                                                                 | set(missing))), cur.ctime_ms,
                                         both)

        await cas_update(self.store, path, merge, decode=_decode, encode=_encode)

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        path = underreplicated_path(self.root, ledger_id)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        return _decode(raw, path)

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        """Every record, walking the four hex levels one directory at a time."""
        async def walk(path: str, depth: int) -> AsyncIterator[str]:
            try:
                names = sorted(await self.store.children(path))
            except NoNodeError:
                return
            for name in names:
                if depth == 0:
                    if name.startswith("urL"):
                        yield f"{path}/{name}"
                else:
                    async for p in walk(f"{path}/{name}", depth - 1):
                        yield p

        async for path in walk(f"{self.base}/ledgers", 4):
            try:
                raw, _ = await self.store.get(path)
            except NoNodeError:
                continue
            yield _decode(raw, path)

    def _lock_path(self, ledger_id: int) -> str:
        return f"{self.base}/locks/urL{ledger_id:010d}"

    async def acquire_lock(self, ledger_id: int, holder: str = "") -> int | None:
        """Become the one worker of this ledger: the record's version at lock time, or
        None if another worker holds it or the record is gone."""
        stat = await self.store.exists(underreplicated_path(self.root, ledger_id))
        if stat is None:
            return None
        try:
            await self.store.create(self._lock_path(ledger_id), holder.encode(),
                                    ephemeral=True, make_parents=True)
        except NodeExistsError:
            return None
        return stat.version

    async def lock_holder(self, ledger_id: int) -> str | None:
        try:
            raw, _ = await self.store.get(self._lock_path(ledger_id))
        except NoNodeError:
            return None
        return raw.decode(errors="replace")

    async def release_lock(self, ledger_id: int) -> None:
        try:
            _, stat = await self.store.get(self._lock_path(ledger_id))
        except NoNodeError:
            return
        if stat.ephemeral_owner == self.store.session_id:
            try:
                await self.store.delete(self._lock_path(ledger_id))
            except NoNodeError:
                pass

    async def mark_replicated(self, ledger_id: int, version: int = -1) -> bool:
        """The ledger is whole again: delete its record (only at ``version``, the one the
        lock saw) and release our lock. False if it was re-marked meanwhile (kept)."""
        path = underreplicated_path(self.root, ledger_id)
        deleted = True
        try:
            await self.store.delete(path, version)
        except NoNodeError:
            pass
        except BadVersionError:
            deleted = False
        if deleted:
            parent = path.rsplit("/", 1)[0]
            for _ in range(4):  # prune the empty hex directories, best effort
                try:
                    await self.store.delete(parent)
                except (NotEmptyError, NoNodeError):
                    break
                parent = parent.rsplit("/", 1)[0]
        await self.release_lock(ledger_id)
        return deleted

    async def pick(self, rng: random.Random, holder: str = "") -> tuple[int, int] | None:
        """Lock one queued ledger nobody holds: ``(ledger id, record version)``, or None.
        The tree is walked with every level shuffled, so workers spread out."""
        try:
            locked = set(await self.store.children(f"{self.base}/locks"))
        except NoNodeError:
            locked = set()

        async def walk(path: str, depth: int) -> tuple[int, int] | None:
            try:
                names = await self.store.children(path)
            except NoNodeError:
                return None
            rng.shuffle(names)
            for name in names:
                if depth == 0:
                    if not name.startswith("urL") or name in locked:
                        continue
                    try:
                        lid = int(name[3:])
                    except ValueError:
                        continue
                    version = await self.acquire_lock(lid, holder)
                    if version is not None:
                        return lid, version
                else:
                    found = await walk(f"{path}/{name}", depth - 1)
                    if found is not None:
                        return found
            return None

        return await walk(f"{self.base}/ledgers", 4)

    async def count(self) -> int:
        n = 0
        async for _ in self.list_underreplicated():
            n += 1
        return n

    # -- the lost-bookie delay and the check timestamps --------------------------------

    @property
    def delay_path(self) -> str:
        return f"{self.base}/lostBookieRecoveryDelay"

    async def get_lost_bookie_delay(self) -> int | None:
        try:
            raw, _ = await self.store.get(self.delay_path)
        except NoNodeError:
            return None
        try:
            return int(raw.decode().strip())
        except ValueError as exc:
            raise CorruptMetadataError(self.delay_path, f"not a number of seconds: {raw!r}") \
                from exc

    async def set_lost_bookie_delay(self, seconds: int) -> None:
        """Write the delay (rewriting the same value makes the auditor audit now)."""
        if seconds < 0:
            raise ValueError(f"lost bookie recovery delay must be >= 0, got {seconds}")
        data = str(seconds).encode()
        try:
            await self.store.set(self.delay_path, data)
        except NoNodeError:
            try:
                await self.store.create(self.delay_path, data, make_parents=True)
            except NodeExistsError:
                await self.store.set(self.delay_path, data)

    async def ensure_lost_bookie_delay(self, default: int) -> int:
        """The delay in ZooKeeper, created from ``default`` when absent."""
        current = await self.get_lost_bookie_delay()
        if current is not None:
            return current
        try:
            await self.store.create(self.delay_path, str(default).encode(), make_parents=True)
        except NodeExistsError:
            pass
        return await self.get_lost_bookie_delay() or 0

    async def get_check_time(self, name: str) -> int:
        try:
            raw, _ = await self.store.get(f"{self.base}/{name}")
            return int(raw.decode())
        except (NoNodeError, ValueError):
            return 0

    async def set_check_time(self, name: str, ms: int) -> None:
        path = f"{self.base}/{name}"
        try:
            await self.store.set(path, str(ms).encode())
        except NoNodeError:
            try:
                await self.store.create(path, str(ms).encode(), make_parents=True)
            except NodeExistsError:
                await self.store.set(path, str(ms).encode())

    # -- the autorecovery switch -------------------------------------------------------

    async def is_enabled(self) -> bool:
        return await self.store.exists(f"{self.base}/disable") is None

    async def set_enabled(self, enabled: bool) -> None:
        path = f"{self.base}/disable"
        try:
            if enabled:
                await self.store.delete(path)
            else:
                await self.store.create(path, b"", make_parents=True)
        except (NoNodeError, NodeExistsError):
            pass

    async def wait_enabled(self) -> None:
        """Return once autorecovery is enabled (at once if it is)."""
        async with self.store.watch(f"{self.base}/disable", WatchKind.DATA) as events:
            async for _ in events:
                if await self.is_enabled():
                    return

    async def wait_disabled(self) -> None:
        async with self.store.watch(f"{self.base}/disable", WatchKind.DATA) as events:
            async for _ in events:
                if not await self.is_enabled():
                    return


class AuditorElection:
    """Candidacy in the auditor election for one process."""

    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.base = f"{root}/underreplication/auditorelection"

    @asynccontextmanager
    async def candidacy(self, bookie_id: str) -> AsyncIterator[_Candidate]:
        """Stand for election; the node is removed on exit (shielded)."""
        node = await self.store.create(f"{self.base}/V_", bookie_id.encode(), ephemeral=True,
                                       sequential=True)
        try:
            yield _Candidate(self, node.rsplit("/", 1)[1])
        finally:
            with trio.move_on_after(5, shield=True):
                try:
                    await self.store.delete(node)
                except (NoNodeError, SessionExpiredError):
                    pass  # gone with the session already

    async def current_auditor(self) -> str | None:
        vote = await self.current_vote()
        return vote[1] if vote is not None else None

    async def current_vote(self) -> tuple[str, str] | None:
        """The winning vote: its node name (new after every re-election) and the id."""
        try:
            names = sorted(await self.store.children(self.base))
        except NoNodeError:
            return None
        for name in names:
            try:
                raw, _ = await self.store.get(f"{self.base}/{name}")
                return name, raw.decode()
            except NoNodeError:
                continue
        return None


@dataclass
class _Candidate:
    election: AuditorElection
    name: str

    async def wait_elected(self) -> None:
        """Return once this candidate is the lowest node; watches only its predecessor.

        Raises NoNodeError if our own node vanished (session expired): stand again.
        """
        store, base = self.election.store, self.election.base
        while True:
            names = sorted(await store.children(base))
            if self.name not in names:
                raise NoNodeError(f"{base}/{self.name}")
            index = names.index(self.name)
            if index == 0:
                return
            predecessor = f"{base}/{names[index - 1]}"
            async with store.watch(predecessor, WatchKind.DATA) as events:
                async for _ in events:
                    if await store.exists(predecessor) is None:
                        break
