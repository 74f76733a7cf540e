"""Java properties files as BookKeeper writes them (ledgerd/base/properties.py)."""

from __future__ import annotations

import pytest

from ledgerd.base.properties import PropertiesError, looks_like_properties, parse_properties

TEXT = (
    "# a comment\n"
    "   ! another comment\n"
    "\n"
    "bookiePort=3181\n"
    "zkServers : zk1:2181,zk2:2181\n"
    "journalDirectories   /data/journal\n"
    "ledgerDirectories=/data/l1,\\\n"
    "                  /data/l2,\\\n"
    "\t/data/l3\n"
    "empty=\n"
    "key\\ with\\ blanks = value with blanks  \n"
    "escaped\\=key=a\\=b\\:c\\\\d\\u0041\\tz\n"
    "bookiePort=3182\n"
)


def test_every_form_a_bk_server_conf_uses() -> None:
    props = {k: v for k, (_line, v) in parse_properties(TEXT).items()}
    assert props == {
        "zkServers": "zk1:2181,zk2:2181",
        "journalDirectories": "/data/journal",
        "ledgerDirectories": "/data/l1,/data/l2,/data/l3",
        "empty": "",
        "key with blanks": "value with blanks  ",
        "escaped=key": "a=b:c\\dA\tz",
        "bookiePort": "3182",  # the last of a repeated key wins
    }
    assert parse_properties(TEXT)["ledgerDirectories"][0] == 7  # where the line started


def test_line_endings_and_a_trailing_continuation() -> None:
    assert parse_properties("a=1\r\nb=2\\\n")["b"][1] == "2"
    assert parse_properties("a=1\r\nb=2\r\n")["a"][1] == "1"
    assert parse_properties("a=x\\\\\nb=y\n") == {"a": (1, "x\\"), "b": (2, "y")}


def test_a_bad_unicode_escape_names_its_line() -> None:
    with pytest.raises(PropertiesError, match=r"line 2: bad unicode escape \\u12x"):
        parse_properties("a=1\nb=\\u12x\n")


@pytest.mark.parametrize(("text", "expected"), [
    ("bookiePort=3181\njournalDirectories=/tmp/bk-txn\n", True),
    ("zkServers: zk1:2181\n", True),
    ("journalMaxSizeMB 2048\n", True),
    ("bookiePort=3181\nreadOnlyModeEnabled=true\n", False),  # valid TOML as well
    ('bookie_port = 3181  # a comment\njournal_directory = "/j"\n', False),
    ('[section]\nkey = "v"\n', False),
    ('ledger_directories = [\n  "/a",\n]\n', False),
])
def test_properties_are_told_from_toml(text: str, expected: bool) -> None:
    assert looks_like_properties(text) is expected
