"""The scrubber service over real storage and the in-memory metadata store: it reads
back what this bookie should hold by the write-set rule, counts what is missing or
corrupt, and marks those ledgers with the ranges it found."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ledgerd.appliance.config import BookieConfig
from ledgerd.appliance.scrubber import Scrubber, ScrubOptions
from ledgerd.base.settings import ConfigError, load_config
from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.metadata.underreplication import UnderreplicationManager
from tests.appliance.harness import KEY, entry, running_bookie

ME, B, C = "127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"


def _md(ensemble: tuple[str, ...], qw: int, closed_at: int | None) -> LedgerMetadata:
    m = LedgerMetadata(ensemble_size=len(ensemble), write_quorum=qw, ack_quorum=1,
                       ensembles=((0, ensemble),))
    return m if closed_at is None else m.closed(closed_at, 0)


async def test_scrubber_finds_missing_and_corrupt_entries_and_marks(tmp_path: Path) -> None:
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    urm = UnderreplicationManager(store, "/ledgers")
    whole, _ = await ledgers.create(_md((ME, B, C), 2, 29))    # we hold 20 of 30
    holed, _ = await ledgers.create(_md((ME, B, C), 3, 29))    # we hold all 30
    lost, _ = await ledgers.create(_md((B, ME, C), 2, 8))      # never written here
    await ledgers.create(_md((B, C), 2, 9))                    # not ours
    opened, _ = await ledgers.create(_md((ME, B), 2, None))    # open: up to our LAC
    async with running_bookie(tmp_path) as b:
        s = b.storage
        for e in range(30):
            if e % 3 != 1:  # position 0 of E3/Qw2 holds e % 3 in {0, 2}
                await s.add_entries(whole, e, [entry(whole, e)], bind_key=KEY)
            if e not in (10, 11, 12, 20):
                data = entry(holed, e)
                if e == 25:  # stored, but its bytes are not what was written
                    data = data[:-1] + bytes([data[-1] ^ 1])
                await s.add_entries(holed, e, [data], bind_key=KEY)
        for e in range(12):  # entries 0..11 carry LACs up to 10
            await s.add_entries(opened, e, [entry(opened, e)], bind_key=KEY)
        scrubber = Scrubber(s, ME, ScrubOptions(rate_per_s=100000), rng=random.Random(1))
        scrubber.ledgers, scrubber.marks = ledgers, urm
        p = await scrubber.scrub_once()
        assert p.done and p.ledgers == 4  # not `other`
        # 20 + 30 + 6 (lost: position 1 holds e % 3 in {0, 1}) + 11 (opened, LAC 10)
        assert p.entries_expected == p.entries_checked == 20 + 30 + 6 + 11
        assert (p.entries_missing, p.entries_corrupt) == (4 + 1 + 6, 1)
        marks = {r.ledger_id: r async for r in urm.list_underreplicated()}
        assert set(marks) == {holed, lost}
        assert dict(marks[holed].missing_entries) == {ME: ((10, 12), (20, 20), (25, 25))}
        assert marks[holed].missing_replicas == (ME,)
        assert dict(marks[lost].missing_entries) == {ME: ((0, 7),)}
        assert scrubber.status()["entries_missing"] == 11
        # A sampled pass reads about its share.
        half = Scrubber(s, ME, ScrubOptions(rate_per_s=100000, percentage=50),
                        rng=random.Random(2))
        half.ledgers = ledgers
        p = await half.scrub_once()
        assert 15 < p.entries_checked < 52 and p.entries_expected == 67


def test_scrub_config_keys_are_validated() -> None:
    cfg = load_config(BookieConfig, text="local_scrub_period_s = 60\n"
                      "local_scrub_verification_percentage = 10\n", env={})
    assert cfg.scrub_options().period_s == 60 and cfg.scrub_options().percentage == 10
    with pytest.raises(ConfigError, match="local_scrub_verification_percentage"):
        load_config(BookieConfig, text="local_scrub_verification_percentage = 0\n", env={})
    with pytest.raises(ConfigError, match="local_scrub_verification_percentage"):
        load_config(BookieConfig, text="local_scrub_verification_percentage = 101\n", env={})
    off = load_config(BookieConfig, text="local_scrub_period_s = 0\n"
                      "local_scrub_verification_percentage = 0\n", env={})
    assert off.scrub_options().period_s == 0
