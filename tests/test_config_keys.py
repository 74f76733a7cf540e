"""Every declared configuration key is read by something (issue #19).

A key that is parsed, documented and then ignored tells an operator a lie. For each
field of the bookie's and the client's configuration, some module other than the
declaration has to read it (``.key`` as an attribute), or the declaring module has to
read it outside its declaration (``self.key`` in a method that builds options).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ledgerd.appliance.config import BookieConfig
from ledgerd.config import ClientConfig
from ledgerd.kafka.config import GatewayConfig
from ledgerd.metadata.settings import ZooKeeperSettings

ROOT = Path(__file__).resolve().parent.parent


def _sources(*folders: str) -> dict[Path, str]:
    return {p: p.read_text() for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))}


# Where each class's keys may be read: the bookie's by the bookie, its storage and the
# CLI; the client's by the client and the CLI (a key both declare must be read on each
# side); ZooKeeper's by either.
CLIENT = _sources("ledgerd", "tools")  # (rglob does not follow ledgerd/appliance etc.)
BOOKIE = _sources("appliance", "disk", "tools")
ZOOKEEPER = _sources("appliance", "disk", "ledgerd", "metadata", "tools")
GATEWAY = _sources("ledgerd/kafka", "appliance")  # (the process entry is in appliance)
CASES = sorted(
    {("zookeeper", f.name) for f in dataclasses.fields(ZooKeeperSettings)}
    | {("bookie", f.name) for f in dataclasses.fields(BookieConfig)
       if f.name not in {z.name for z in dataclasses.fields(ZooKeeperSettings)}}
    | {("client", f.name) for f in dataclasses.fields(ClientConfig)
       if f.name not in {z.name for z in dataclasses.fields(ZooKeeperSettings)}}
    | {("gateway", f.name) for f in dataclasses.fields(GatewayConfig)
       if f.name not in {c.name for c in dataclasses.fields(ClientConfig)}})


def readers_of(key: str, text: dict[Path, str]) -> list[str]:
    attribute = re.compile(rf"\.{key}\b")
    return [f"{p.name}:{n}" for p, t in text.items()
            for n, line in enumerate(t.splitlines(), 1) if attribute.search(line)]


@pytest.mark.parametrize(("side", "key"), CASES)
def test_key_is_read(side: str, key: str) -> None:
    text = {"client": CLIENT, "bookie": BOOKIE, "zookeeper": ZOOKEEPER, "gateway": GATEWAY}[side]
    assert readers_of(key, text), f"{side} key {key} is declared but nothing reads it"


def test_the_check_sees_an_unread_key(tmp_path: Path) -> None:
    decl = tmp_path / "config.py"
    decl.write_text("class C:\n    dusty_knob: int = setting(1, doc='never read')\n"
                    "    used: int = setting(2, doc='read')\n\n"
                    "    def options(self):\n        return dict(used=self.used)\n")
    text = {decl: decl.read_text()}
    assert readers_of("dusty_knob", text) == []
    assert readers_of("used", text) != []
