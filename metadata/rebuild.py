"""Rebuilding ledger metadata from what the bookies hold (pure planning, no I/O).

Input, per bookie: every ledger it holds, with the entry ids present (ranges), fence
state, term, the highest LAC its entries carry and the check of its master key (the
``LedgerHoldings`` admin request); optionally the latest snapshot's metadata. Output: a
``Plan`` of ledgers to write (``LedgerMetadata``) and what could not be known.

Rules, per ledger missing from the live metadata:

- **Snapshot first.** A ledger the snapshot has keeps its quorums, digest, password
  check, custom metadata, ctime, ``unbounded``/``noops``, and its ensembles up to the
  snapshot's last fragment; a ledger CLOSED there stays closed at the same entry.
- **Write sets.** Without a snapshot, the ensemble comes from the striping rule: entry
  ``e`` of a fragment is on its ensemble's positions ``e mod E .. e + Qw - 1 mod E``.
  ``Qw`` is the most copies that at least two entries have (one entry with an extra
  copy, written to a bookie just before the writer replaced it, does not count) and
  ``E`` the size under which the fewest fragments explain every entry's holders (ties:
  the larger): a fragment grows entry by entry while some placement of its bookies on
  ``E`` positions puts every entry's holders in its write set, and the first entry no
  placement fits (a bookie replaced mid-ledger: its replacement holds the entries
  after the change) starts a new fragment. A fragment's positions that no entry shows
  keep the previous fragment's bookie. A ledger whose entry 0 is a log header takes
  ``E``, ``Qw`` and ``Qa`` from it; otherwise ``Qa`` cannot be known from the bookies:
  it is taken as 1, the safest for recovery (and listed as assumed).
- **The end** (BookKeeper's recovery rule): every entry up to the highest LAC any
  bookie reports was acknowledged and is kept; past it, entries are kept while each is
  held by at least one bookie (recovery reads it and writes it back to Qa copies); the
  first entry held nowhere ends the ledger. A gap at or below the LAC (an acknowledged
  entry held nowhere) is reported as lost, never skipped silently. The plan shows this
  end, but a rebuilt ledger is written OPEN: bookies cannot tell a ledger its writer
  closed from one still written, so the closing is left to the protocol's recovery
  (which fences first): the first open with recovery, or ``rebuild --secret-file``.
- **Key check.** Every holder of a ledger must report the same key check (or none); a
  mismatch is reported and the ledger is left out.
- The digest type comes from the caller (``detect_digest`` on entry 0's bytes).

**Logs** (``plan_logs``): a ledger whose entry 0 is a log header (``metadata.logheader``)
names its log and its position (``seq``) there, and the ledger before it. A log missing
from the live metadata is put back as the chain that ends at its highest ``seq`` (ties:
the ledger holding log entries, then the higher id) and follows each header's ``prev``
back while the previous ``seq`` is found: truncated ledgers (deleted) end it, and so does
a ledger without a header (appended from elsewhere); its ``base`` (the truncation point)
is the first ledger's recorded first offset, so offsets do not move. Ledgers with the
log's header off the chain (a writer that stopped before adding its new ledger) are
named, not listed. Where a header's ``prev`` is gone but ledgers of the previous
``seq`` are found, compaction replaced that ledger (its replacement holds its place and
header): the chain goes through the one holding the most log entries (then the lowest
id), so a stray replacement a crashed pass left beside the swapped-in one does not cut
the log short; one without log entries is no replacement and ends the chain there.
The rebuilt ledgers keep the header mark, so readers skip entry 0.
Known limit: ledgers a log dropped with a deletion delay (its record's ``deferred``, the
Kafka gateway's ``file.delete.delay.ms``) are still on the bookies until due; a rebuild
inside that window follows their headers as if they were listed, so it can list again
what retention or DeleteRecords dropped (offsets unchanged, records back) or an old
ledger compaction replaced (the same records and more, its replacement named as off the
chain), and the rebuilt record defers nothing, so those ledgers are not deleted until
an operator or retention drops them again. Nothing acknowledged is lost either way.
The log's ``writers`` count is the highest its headers record (a Kafka partition's
leader epoch goes on from there).

**Kafka topics** (``plan_topics``): a Kafka partition log's headers carry its topic
(``kafka_topics.TopicOrigin``: name, partition, the topic record when the ledger was
made). A topic neither the live metadata nor the snapshot has gets its record back
from the newest such header (the highest ledger id: the latest configs any ledger
recorded), with the partition count at least one past the highest partition seen under
the same topic id, and each partition's DeleteRecords low watermark the highest seen.

**OPEN snapshot ledgers against the bookies**: a ledger OPEN in the snapshot whose
bookies show entries on a bookie its last ensemble does not name (an ensemble change
after the snapshot) gets its later fragments from the bookies; if the live metadata
still has the snapshot's version (``restore`` wrote it), ``LedgerPlan.update`` says to
write it over (compare-and-set).

What the bookies cannot say (cursors and Kafka group offsets, custom metadata, logs
written without headers) without a snapshot is in ``Plan.lost``.
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import google_crc32c

from ledgerd.metadata.kafka_topics import TopicOrigin, TopicRecord, partition_log_name
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.logheader import HEADER_KEY, LogHeader

__all__ = ["BookieLedger", "LedgerPlan", "LogPlan", "Plan", "TopicPlan", "detect_digest",
           "merge_ranges", "plan_ledger", "plan_logs", "plan_rebuild", "plan_topics"]

_HEADER = 32
MAX_ORDER_SEARCH = 7  # bookies of a fragment whose orderings are searched (7! = 5040)
MAX_PLACEMENTS = 5040  # placements of a fragment's bookies kept while it grows


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieLedger:
    """One ledger as one bookie holds it."""

    bookie_id: str
    ledger_id: int
    ranges: tuple[tuple[int, int], ...]
    fenced: bool = False
    term: int = 0
    lac: int = -1
    key_check: str = ""  # hex; "" when the bookie has no key bound

    def holds(self, entry_id: int) -> bool:
        for a, b in self.ranges:
            if a <= entry_id <= b:
                return True
            if a > entry_id:
                return False
        return False


@dataclass(frozen=True, slots=True)
class LedgerPlan:
    ledger_id: int
    metadata: LedgerMetadata | None  # None: not rebuilt (see problems)
    source: str  # "snapshot", "bookies", "snapshot+bookies"
    holders: tuple[str, ...]
    problems: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()
    end: int = -1  # the last entry recovery keeps (the ledger's end once closed)
    update: bool = False  # live from the snapshot: write over it (see the module doc)


@dataclass(frozen=True, slots=True)
class LogPlan:
    """A log put back from its ledgers' headers."""

    name: str
    ledgers: tuple[int, ...]
    base: int  # the offset of the first listed ledger's first log entry
    first_seq: int  # the position of the first listed ledger (earlier ones truncated)
    problems: tuple[str, ...] = ()
    left_out: tuple[int, ...] = ()  # ledgers with this log's header, not listed
    writers: int = 0  # the log record's writers count (the highest its headers record)


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """A Kafka topic record made again from its partition logs' headers."""

    name: str
    record: TopicRecord
    ledger_id: int  # the ledger whose header gave the record (the newest)
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    ledgers: tuple[LedgerPlan, ...]
    lost: tuple[str, ...] = ()
    skipped_live: int = 0  # ledgers the live metadata already has
    logs: tuple[LogPlan, ...] = ()
    live_logs: tuple[str, ...] = ()  # logs the headers name that the live metadata has
    topics: tuple[TopicPlan, ...] = ()  # Kafka topic records made from the headers
    live_topics: tuple[str, ...] = ()  # topics the headers name, live or in the snapshot

    @property
    def writable(self) -> list[LedgerPlan]:
        return [p for p in self.ledgers if p.metadata is not None]


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, overlapping or touching ranges joined (pages may split a range)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def detect_digest(entry: bytes) -> str:
    """The digest type of a ledger from its entry 0's bytes: a CRC that verifies, else
    the digest size that entry 0's cumulative length implies (20: hmac, 0: dummy)."""
    if len(entry) >= _HEADER + 4 and google_crc32c.value(entry[:_HEADER] + entry[_HEADER + 4:]
                                                         ) == int.from_bytes(
            entry[_HEADER:_HEADER + 4], "big"):
        return "crc32c"
    if len(entry) >= _HEADER + 8 and zlib.crc32(entry[:_HEADER] + entry[_HEADER + 8:]) == \
            int.from_bytes(entry[_HEADER:_HEADER + 8], "big"):
        return "crc32"
    length = int.from_bytes(entry[24:32], "big", signed=True) if len(entry) >= _HEADER else -1
    size = len(entry) - _HEADER - length
    return "hmac" if size == 20 else "dummy" if size == 0 else "crc32c"


def _holders_by_entry(held: Sequence[BookieLedger], last: int) -> list[tuple[str, ...]]:
    out: list[list[str]] = [[] for _ in range(last + 1)]
    for h in held:
        for a, b in h.ranges:
            for e in range(max(0, a), min(b, last) + 1):
                out[e].append(h.bookie_id)
    return [tuple(sorted(x)) for x in out]


def _copies(by_entry: Sequence[tuple[str, ...]]) -> int:
    """``Qw`` from the copies entries have: the most that at least two entries have (a
    single entry with an extra copy, left on a bookie the writer then replaced, does not
    count), or the most any has when no count repeats."""
    counts = Counter(map(len, by_entry))
    counts.pop(0, None)
    repeated = [c for c, n in counts.items() if n >= 2]
    return max(repeated or counts or [1])


def _extend(placements: list[dict[str, int]], members: Sequence[str], who: Sequence[str],
            entry_id: int, size: int, write_quorum: int) -> list[dict[str, int]]:
    """The placements (bookie -> position) of ``members`` plus ``who`` under which entry
    ``entry_id``'s holders ``who`` are all in its write set (none: no placement fits)."""
    new = [b for b in who if b not in members]
    if not new:
        return [p for p in placements
                if all((p[b] - entry_id) % size < write_quorum for b in who)]
    if len(members) + len(new) > size:
        return []
    out: list[dict[str, int]] = []
    for p in placements:
        free = [i for i in range(size) if i not in p.values()]
        for spots in itertools.permutations(free, len(new)):
            q = {**p, **dict(zip(new, spots, strict=True))}
            if all((q[b] - entry_id) % size < write_quorum for b in who):
                out.append(q)
                if len(out) >= MAX_PLACEMENTS:
                    return out
    return out


def _split(by_entry: Sequence[tuple[str, ...]], size: int, qw: int, last: int
           ) -> list[tuple[int, dict[str, int]]]:
    """Fragments as ``(first entry, a placement of the bookies seen in it)``: each grows
    while a placement fits every entry's holders (the module doc). An entry with more
    holders than ``qw`` (an extra copy) constrains nothing."""
    out: list[tuple[int, dict[str, int]]] = []
    first = 0
    placements: list[dict[str, int]] = [{}]
    members: list[str] = []
    full = qw >= size  # every position holds every entry: any placement fits
    # Once one placement of all ``size`` bookies is left, each entry is checked against
    # its write set by residue: the fast path, the whole ledger for most ledgers.
    fast: list[frozenset[str]] | None = None
    for e in range(min(last, len(by_entry) - 1) + 1):
        who = by_entry[e]
        if not who or len(who) > qw:
            continue
        if fast is not None:
            if fast[e % size].issuperset(who):
                continue
            grown: list[dict[str, int]] = []
        else:
            grown = _extend(placements, members, who, e, size, qw)
            if full and grown:
                grown = grown[:1]
        if not grown:
            out.append((first, placements[0]))
            first, members, fast = e, [], None
            grown = _extend([{}], [], who, e, size, qw)[:1 if full else MAX_PLACEMENTS] or [{}]
        placements = grown
        members = list(dict.fromkeys([*members, *who]))
        if len(placements) == 1 and len(members) == size:
            p = placements[0]
            fast = [frozenset(b for b, i in p.items() if (i - r) % size < qw)
                    for r in range(size)]
    out.append((first, placements[0]))
    return out


def _ensembles(split: list[tuple[int, dict[str, int]]], holders: Sequence[str], size: int,
               prior: Sequence[str] = (), others: Sequence[str] = ()
               ) -> list[tuple[int, tuple[str, ...]]]:
    """Each fragment's ensemble: its placement, positions no entry shows given the
    previous fragment's bookie there (``prior`` before the first), then other holders,
    then bookies that hold none of it (``others``: a ledger of fewer entries than its
    ensemble, e.g. a log's ledger holding only its header, shows too few bookies)."""
    out: list[tuple[int, tuple[str, ...]]] = []
    previous = list(prior)
    for first, placement in split:
        slots: list[str | None] = [None] * size
        for b, i in placement.items():
            slots[i] = b
        for i in range(size):
            if slots[i] is None and i < len(previous) and previous[i] not in slots:
                slots[i] = previous[i]
        spare = iter([b for b in [*sorted(holders), *sorted(set(others) - set(holders))]
                      if b not in slots])
        ensemble = tuple(b for b in (x if x is not None else next(spare, None)
                                     for x in slots) if b is not None)
        out.append((first, ensemble))
        previous = list(ensemble)
    return out


def _fragments(by_entry: Sequence[tuple[str, ...]], holders: Sequence[str], size: int | None,
               qw: int, last: int, prior: Sequence[str] = (), others: Sequence[str] = ()
               ) -> tuple[int, list[tuple[int, tuple[str, ...]]]]:
    """``(E, fragments)``: under ``size`` if known (a snapshot, a log header), else the
    size whose split needs the fewest fragments (ties: the larger). Past
    ``MAX_ORDER_SEARCH`` bookies: one fragment of them, sorted (the caller says so)."""
    n = len(holders)
    if size is None and n > MAX_ORDER_SEARCH:
        return n, [(0, tuple(sorted(holders)))]
    if size is not None and size > MAX_ORDER_SEARCH:
        return size, [(0, tuple(sorted(holders)[:size]))]
    if size is None:
        split = _split(by_entry, n, min(qw, n), last)
        size = n
        if len(split) > 1:  # a bookie replaced mid-ledger? fewer positions may explain it
            for e_size in range(n - 1, max(1, qw) - 1, -1):
                other = _split(by_entry, e_size, qw, last)
                if len(other) < len(split):
                    split, size = other, e_size
    else:
        split = _split(by_entry, size, min(qw, size), last)
    return size, _ensembles(split, holders, size, prior, others)


def plan_ledger(ledger_id: int, held: Sequence[BookieLedger], *,
                snapshot: LedgerMetadata | None = None, digest_type: str = "crc32c",
                length: int = 0, now_ms: int = 0, header: LogHeader | None = None,
                others: Sequence[str] = ()) -> LedgerPlan:
    """The metadata one ledger gets back (see the module doc); ``header`` is its entry
    0's log header, if it has one; ``others``, the bookies that answered (to fill
    ensemble positions no entry shows)."""
    holders = tuple(sorted(h.bookie_id for h in held))
    problems: list[str] = []
    assumed: list[str] = []
    checks = {h.key_check for h in held if h.key_check}
    if len(checks) > 1:
        return LedgerPlan(ledger_id, None, "bookies", holders,
                          (f"bookies disagree on the ledger's key: {sorted(checks)}",))
    if not held:
        if snapshot is None:
            return LedgerPlan(ledger_id, None, "bookies", holders, ("no bookie holds it",))
        return LedgerPlan(ledger_id, snapshot, "snapshot", holders,
                          ("no bookie holds it (metadata from the snapshot only)",))
    lac = max(h.lac for h in held)
    top = max((b for h in held for _, b in h.ranges), default=-1)
    by_entry = _holders_by_entry(held, top)
    # The end: acknowledged entries up to the LAC, then each entry held somewhere.
    last = -1
    for e in range(top + 1):
        if by_entry[e]:
            last = e
        elif e <= lac:
            problems.append(f"entry {e} is below the LAC {lac} but no bookie holds it "
                            "(acknowledged and lost)")
            last = e
        else:
            break
    if snapshot is not None and snapshot.is_closed:
        if last < snapshot.last_entry_id:
            problems.append(f"the snapshot closed it at entry {snapshot.last_entry_id}; the "
                            f"bookies hold entries only up to {last}")
        return LedgerPlan(ledger_id, snapshot, "snapshot", holders, tuple(problems),
                          end=snapshot.last_entry_id)
    size: int | None
    if snapshot is not None:
        size, qw, qa = snapshot.ensemble_size, snapshot.write_quorum, snapshot.ack_quorum
    elif header is not None:
        size, qw, qa = header.ensemble_size, header.write_quorum, header.ack_quorum
    else:
        size, qw = None, max(1, min(_copies(by_entry), len(holders)))
        # The smallest ack quorum: recovery then counts an entry absent only when every
        # bookie of its write set says so. A larger guess could let recovery truncate an
        # entry acknowledged by fewer copies than guessed; 1 only makes it wait longer.
        qa = 1
        assumed.append(f"ack_quorum {qa} (bookies do not record it; the safest for "
                       f"recovery)")
    prior = snapshot.ensembles[-1][1] if snapshot is not None else ()
    e_size, ensembles = _fragments(by_entry, holders, size, qw, last, prior, others)
    if e_size > MAX_ORDER_SEARCH:
        assumed.append(f"ensemble order sorted ({e_size} bookies: orderings not searched)")
    if snapshot is not None:
        ensembles = _after_snapshot(snapshot, ensembles)
    term = max(h.term for h in held)
    unbounded = snapshot.unbounded if snapshot is not None else term > 0
    if unbounded and (snapshot is None or term > snapshot.term):
        # A limit, named in the plan (issue 49 stays partial for it): bookies do not
        # mark a term's TRUNCATE no-op entries, so readers of a rebuilt unbounded ledger
        # may return no-ops of later terms as entries.
        problems.append(f"unbounded ledger at term {term}: the no-op entries of terms "
                        f"{'after the snapshot' if snapshot is not None else 'so far'} "
                        "are not known (readers may return them as entries)")
    base = snapshot
    # Written OPEN, never CLOSED here: the bookies cannot tell a ledger its writer closed
    # from one still being written, and closing without fencing would let a live writer
    # add acknowledged entries past the end. The protocol's recovery (the first open
    # with recovery, or ``rebuild --secret-file``) fences it and closes it at ``last``.
    try:
        if base is not None:
            md = replace(base, ensembles=tuple(ensembles), state=LedgerState.OPEN,
                         last_entry_id=-1, length=0, term=max(term, base.term))
        else:
            md = LedgerMetadata(
                ensemble_size=e_size, write_quorum=qw, ack_quorum=qa,
                ensembles=tuple(ensembles), state=LedgerState.OPEN,
                digest_type=digest_type, password_check=next(iter(checks), ""),
                ctime_ms=now_ms, term=term, unbounded=unbounded,
                custom_metadata={HEADER_KEY: "1"} if header is not None else {})
    except ValueError as exc:
        return LedgerPlan(ledger_id, None, "bookies", holders,
                          (*problems, f"cannot form metadata: {exc}"), tuple(assumed))
    return LedgerPlan(ledger_id, md, "snapshot+bookies" if snapshot else "bookies", holders,
                      tuple(problems), tuple(assumed), end=last)


def _after_snapshot(snapshot: LedgerMetadata, found: list[tuple[int, tuple[str, ...]]]
                    ) -> list[tuple[int, tuple[str, ...]]]:
    """The snapshot's fragments, then those the bookies show after its last one."""
    keep = list(snapshot.ensembles)
    last_first = keep[-1][0]
    keep += [(first, ens) for first, ens in found if first > last_first and ens != keep[-1][1]]
    return keep


def _replacement(candidates: Sequence[int], ends: Mapping[int, int]) -> int:
    """Of the ledgers holding the same place of a log whose original is gone, the one
    the chain goes through. Each is a compaction replacement of that original (the one
    a pass swapped in, or a stray one a pass left when it died before its swap; either
    holds every record compaction keeps, at its original offset: the same entries
    with fewer records). A complete one holds the most entries (a pass that died
    while writing left fewer): the fullest, then the lowest id (the earliest)."""
    return min(candidates, key=lambda lid: (-ends.get(lid, 0), lid))


def plan_logs(headers: Mapping[int, LogHeader], ends: Mapping[int, int], *,
              live: Collection[str] = ()) -> tuple[LogPlan, ...]:
    """The logs the headers name and the live metadata lacks (``live``), by name: each
    the chain ending at its highest ``seq`` (the module doc). ``ends`` gives each
    ledger's last entry (its log entries are 1..end)."""
    by_name: dict[str, dict[int, LogHeader]] = {}
    for lid, h in headers.items():
        by_name.setdefault(h.name, {})[lid] = h
    out: list[LogPlan] = []
    for name in sorted(set(by_name) - set(live)):
        mine = by_name[name]
        tail = max(mine, key=lambda lid: (mine[lid].seq, ends.get(lid, 0) >= 1, lid))
        chain = [tail]
        while True:
            h = mine[chain[-1]]
            prev = h.prev_ledger_id
            if prev in mine and mine[prev].seq == h.seq - 1 and prev not in chain:
                chain.append(prev)
                continue
            # its prev is gone: compaction (the Kafka gateway's cleaner) put a
            # replacement with the same place in the log in its stead
            # (one with no log entry is no replacement: an orphan of a failed roll, or
            # left by a ledger truncated away; the log starts after it)
            before = [lid for lid in mine if mine[lid].seq == h.seq - 1 and lid not in chain
                      and ends.get(lid, 0) >= 1]
            if prev not in mine and before:
                chain.append(_replacement(before, ends))
                continue
            break
        chain.reverse()
        problems: list[str] = []
        counts = [max(0, ends.get(lid, 0)) for lid in chain]
        known = [(i, mine[lid].first_offset) for i, lid in enumerate(chain)
                 if mine[lid].first_offset >= 0]
        if known:
            i, offset = known[0]
            base = offset - sum(counts[:i])
            if i:
                problems.append(f"the first {i} ledger(s) do not record their first offset: "
                                f"base {base} counted back from ledger {chain[i]}")
        else:
            base = 0
            problems.append("no ledger records its first offset: offsets restart at 0")
        for i in range(len(chain) - 1):
            a, b = mine[chain[i]], mine[chain[i + 1]]
            if a.first_offset >= 0 and b.first_offset >= 0 and \
                    a.first_offset + counts[i] != b.first_offset:
                problems.append(
                    f"ledger {chain[i + 1]} records first offset {b.first_offset}, but ledger "
                    f"{chain[i]} ends at offset {a.first_offset + counts[i]}: offsets after "
                    f"it move by {a.first_offset + counts[i] - b.first_offset}")
        left = tuple(sorted(set(mine) - set(chain)))
        if left:
            problems.append(f"ledger(s) {list(left)} carry this log's header but are not on "
                            "the chain (a writer that stopped before adding its new ledger, "
                            "or ledgers before a gap): left out of the log, kept as ledgers")
        out.append(LogPlan(name, tuple(chain), base, mine[chain[0]].seq, tuple(problems),
                           left, max(mine[lid].writers for lid in chain)))
    return tuple(out)


def plan_topics(headers: Mapping[int, LogHeader], *, known: Collection[str] = ()
                ) -> tuple[TopicPlan, ...]:
    """The Kafka topic records the headers carry (``TopicOrigin``) for topics not in
    ``known`` (live or in the snapshot), by name (the module doc)."""
    by_topic: dict[str, dict[int, TopicOrigin]] = {}
    for lid, h in headers.items():
        origin = TopicOrigin.from_extra(h.extra) if h.extra else None
        if origin is not None and h.name == partition_log_name(origin.topic, origin.partition):
            by_topic.setdefault(origin.topic, {})[lid] = origin
    out: list[TopicPlan] = []
    for name in sorted(set(by_topic) - set(known)):
        mine = by_topic[name]
        newest = max(mine)
        record = mine[newest].record
        same = [o for o in mine.values() if o.record.topic_id == record.topic_id]
        problems: list[str] = []
        others = sorted({o.record.topic_id for o in mine.values()} - {record.topic_id})
        if others:
            problems.append(f"ledgers of an earlier topic of this name (id(s) {others}) "
                            "left out of the record")
        partitions = max(record.partitions, max(o.partition for o in same) + 1)
        starts: dict[int, int] = {}
        for o in same:
            for p, offset in o.record.log_start.items():
                starts[p] = max(starts.get(p, 0), offset)
        out.append(TopicPlan(name, replace(record, partitions=partitions, log_start=starts),
                             newest, tuple(problems)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RebuildInput:
    """Everything ``plan_rebuild`` needs, gathered by the caller."""

    held: Mapping[int, Sequence[BookieLedger]]
    live: frozenset[int] = frozenset()
    snapshot: Mapping[int, LedgerMetadata] = field(default_factory=dict)
    digests: Mapping[int, str] = field(default_factory=dict)
    lengths: Mapping[int, int] = field(default_factory=dict)
    snapshot_logs: Sequence[str] = ()
    now_ms: int = 0
    headers: Mapping[int, LogHeader] = field(default_factory=dict)  # entry 0 log headers
    live_logs: frozenset[str] = frozenset()
    live_topics: frozenset[str] = frozenset()  # Kafka topics the live metadata has
    snapshot_topics: frozenset[str] = frozenset()  # Kafka topics the snapshot has


def plan_rebuild(given: RebuildInput) -> Plan:
    """Plans for every ledger a bookie holds or the snapshot lists and the live metadata
    lacks, in id order; then, for ledgers OPEN in the snapshot and live (restored), the
    fragments the bookies show after the snapshot's (``update``); then the logs the
    ledgers' headers name that neither the live metadata nor the snapshot has."""
    wanted = sorted((set(given.held) | set(given.snapshot)) - given.live)
    answered = sorted({h.bookie_id for held in given.held.values() for h in held})
    plans = [plan_ledger(lid, given.held.get(lid, ()), snapshot=given.snapshot.get(lid),
                         digest_type=given.digests.get(lid, "crc32c"),
                         length=given.lengths.get(lid, 0), now_ms=given.now_ms,
                         header=given.headers.get(lid), others=answered)
             for lid in wanted]
    skipped = len((set(given.held) | set(given.snapshot)) & given.live)
    for lid in sorted(set(given.snapshot) & given.live & set(given.held)):
        snap = given.snapshot[lid]
        if snap.is_closed:
            continue
        p = plan_ledger(lid, given.held[lid], snapshot=snap, now_ms=given.now_ms)
        if p.metadata is not None and p.metadata.ensembles != snap.ensembles:
            plans.append(replace(p, metadata=replace(snap, ensembles=p.metadata.ensembles),
                                 update=True, problems=(*p.problems, (
                                     f"OPEN in the snapshot; the bookies show "
                                     f"{len(p.metadata.ensembles) - len(snap.ensembles)} "
                                     "fragment(s) after its last (an ensemble change after "
                                     "the snapshot)"))))
            skipped -= 1
    plans.sort(key=lambda p: p.ledger_id)
    ends = {lid: max((b for h in held for _, b in h.ranges), default=-1)
            for lid, held in given.held.items()}
    ends.update({p.ledger_id: p.end for p in plans})
    named = {n.rsplit("/", 1)[-1] for n in given.snapshot_logs}
    # A ledger not rebuilt is on no log (its log starts after it, as after a gap).
    unwritten = {p.ledger_id for p in plans if p.metadata is None}
    written = {lid: h for lid, h in given.headers.items() if lid not in unwritten}
    known_topics = given.live_topics | given.snapshot_topics
    # a topic only from ledgers that are rebuilt (its record must not name a partition
    # whose log does not come back), and its partition logs only from the ledgers of
    # the incarnation (topic id) the record is made from: a topic deleted and made
    # again restarts its logs at seq 0, and the older chain must not win on its seq
    topics = plan_topics(written, known=known_topics)
    chosen = {t.name: t.record.topic_id for t in topics}

    def this_incarnation(h: LogHeader) -> bool:
        origin = TopicOrigin.from_extra(h.extra) if h.extra else None
        return (origin is None or origin.topic not in chosen
                or origin.record.topic_id == chosen[origin.topic])

    logs = plan_logs({lid: h for lid, h in written.items() if this_incarnation(h)},
                     ends, live=given.live_logs | named)
    lost: list[str] = []
    if not given.snapshot:
        lost.append("cursors (consumers' positions) and Kafka group offsets; Kafka "
                    "transaction records and partition flags; custom metadata; ack quorums "
                    "of ledgers without a log header (no snapshot given)")
        lost.append("logs whose ledgers carry no log header: written before headers "
                    "(Kafka partitions included), ledgers added with append_ledgers, logs "
                    "of one unbounded ledger; Kafka topics none of whose ledgers has a "
                    "header (no snapshot given)")
    named_topics = {o.topic for h in given.headers.values() if h.extra
                    for o in (TopicOrigin.from_extra(h.extra),) if o is not None}
    return Plan(tuple(plans), tuple(lost), skipped, logs,
                tuple(sorted({h.name for h in given.headers.values()}
                             & (given.live_logs | named))), topics,
                tuple(sorted(named_topics & known_topics)))


__all__ += ["RebuildInput"]
