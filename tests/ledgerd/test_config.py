"""Configuration loading: defaults, file, env and flag overrides, and every kind of bad value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ledgerd.appliance.config import BookieConfig
from ledgerd.config import ClientConfig, ConfigError, defaults_toml, load_config, markdown_table


def test_defaults_match_bookkeeper() -> None:
    cfg = load_config(BookieConfig, env={})
    assert cfg.bookie_port == 3181
    assert cfg.journal_max_group_wait_ms == 0.0  # ours: measured in bench/latency.py
    assert cfg.journal_buffered_writes_threshold == 512 * 1024
    assert cfg.journal_max_backups == 5
    assert cfg.journal_max_size_mb == 2048
    assert cfg.flush_interval_ms == 10000
    assert cfg.gc_wait_time_ms == 600000
    assert cfg.minor_compaction_threshold == 0.2
    assert cfg.major_compaction_threshold == 0.8
    assert cfg.disk_usage_threshold == 0.95
    assert cfg.read_only_mode_enabled is True
    assert cfg.effective_index_directories == cfg.ledger_directories
    client = load_config(ClientConfig, env={})
    assert (client.ensemble_size, client.write_quorum_size, client.ack_quorum_size) == (3, 2, 2)
    assert client.throttle == 5000


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(
        'bookie_port = 4000\njournal_directory = "/j"\nledger_directories = ["/a", "/b"]\n'
        "journal_max_group_wait_ms = 1\n"
    )
    cfg = load_config(BookieConfig, path=path, env={"LEDGERD_BOOKIE_PORT": "4001",
                                                      "LEDGERD_UNRELATED": "x"})
    assert cfg.bookie_port == 4001
    assert cfg.journal_directory == "/j"
    assert cfg.ledger_directories == ("/a", "/b")
    assert cfg.journal_max_group_wait_ms == 1.0
    cfg = load_config(BookieConfig, path=path, env={"LEDGERD_BOOKIE_PORT": "4001"},
                      overrides={"bookie_port": 4002})
    assert cfg.bookie_port == 4002


def test_env_parses_every_kind() -> None:
    env = {
        "LEDGERD_JOURNAL_FLUSH_WHEN_QUEUE_EMPTY": "true",
        "LEDGERD_DISK_USAGE_THRESHOLD": "0.97",
        "LEDGERD_LEDGER_DIRECTORIES": "/x, /y",
        "LEDGERD_PAGE_SIZE": "0x1000",
    }
    cfg = load_config(BookieConfig, env=env)
    assert cfg.journal_flush_when_queue_empty is True
    assert cfg.disk_usage_threshold == 0.97
    assert cfg.ledger_directories == ("/x", "/y")
    assert cfg.page_size == 4096


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("bookie_prot = 1", "bookie_prot", "did you mean 'bookie_port'?"),
        ('bookie_port = "3181"', "bookie_port", "an integer"),
        ("bookie_port = 70000", "bookie_port", "between 1 and 65535"),
        ("bookie_port = true", "bookie_port", "an integer"),
        ("disk_usage_threshold = 1.5", "disk_usage_threshold", "between 0 and 1"),
        ('ledger_manager_type = "tree"', "ledger_manager_type", "'flat', 'hierarchical'"),
        ("ledger_directories = []", "ledger_directories", "at least one directory"),
        ('ledger_directories = "/a"', "ledger_directories", "a list of strings"),
        ("read_only_mode_enabled = 1", "read_only_mode_enabled", "true or false"),
        ("disk_usage_lwm_threshold = 0.99", "disk_usage_lwm_threshold", "<= disk_usage_threshold"),
        ("journal_alignment_size = 1000", "journal_alignment_size", "power of two"),
        ('log_level = "LOUD"', "log_level", "'DEBUG'"),
    ],
)
def test_bad_values_name_key_value_and_allowed(text: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BookieConfig, text=text, env={})
    assert info.value.key == key
    assert fragment in str(info.value)


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BookieConfig, env={"LEDGERD_BOOKIE_PORT": "eighty"})
    assert "LEDGERD_BOOKIE_PORT" in str(info.value)
    assert "'eighty'" in str(info.value)


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("bookie_port = = 3\n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_config(BookieConfig, path=path, env={})


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable TOML file"):
        load_config(BookieConfig, path=tmp_path / "nope.toml", env={})


def test_client_quorums_validated() -> None:
    with pytest.raises(ConfigError, match="ensemble_size >= write_quorum_size"):
        load_config(ClientConfig, text="ensemble_size = 2\nwrite_quorum_size = 3", env={})


def test_unknown_override_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"did you mean .zk_servers.\?"):
        load_config(ClientConfig, env={}, overrides={"zk_server": "x"})


def test_defaults_file_round_trips() -> None:
    for cls in (BookieConfig, ClientConfig):
        text = defaults_toml(cls)
        assert load_config(cls, text=text, env={}) == load_config(cls, env={})


def test_docs_table_matches_declarations() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    assert markdown_table(BookieConfig) in doc
    assert markdown_table(ClientConfig) in doc
    from ledgerd.kafka.config import GatewayConfig

    client = {f.name for f in dataclasses.fields(ClientConfig)}
    lines = markdown_table(GatewayConfig).splitlines()
    gateway_only = lines[:2] + [r for r in lines[2:] if r.split("`")[1] not in client]
    assert len(gateway_only) > 10 and "\n".join(gateway_only) in doc


def test_a_check_across_keys_is_reported_beside_the_bad_keys() -> None:
    """A new user's --check: four bad keys and a mechanism the gateway does not know
    (checked across keys, after the others) are five problems in one go."""
    from ledgerd.kafka.config import GatewayConfig

    text = ('gateway_prot = 9092\ngateway_port = 70000\nmax_batch_bytes = 100\n'
            'gateway_tls_client_auth = "maybe"\ngateway_sasl_mechanisms = "PLAIN,GSSAPI"\n')
    with pytest.raises(ConfigError) as info:
        load_config(GatewayConfig, text=text, env={})
    keys = [p.key for p in info.value.problems]
    assert sorted(keys) == sorted(["gateway_prot", "gateway_port", "max_batch_bytes",
                                   "gateway_tls_client_auth", "gateway_sasl_mechanisms"])
    assert "allowed: a known key: did you mean 'gateway_port'?" in str(info.value)


def test_every_bad_key_is_reported_and_bookkeeper_names_are_aliases() -> None:
    from ledgerd.base.settings import ConfigNote

    text = ('bookiePort = 3190\njournalDirectory = "/j"\nbookie_prot = 1\n'
            'disk_usage_threshold = "lots"\nzzz = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(BookieConfig, text=text, env={})
    msg = str(info.value)
    assert msg.startswith("3 config problems: ") and len(info.value.problems) == 3
    assert "did you mean 'bookie_port'?" in msg and "'lots'" in msg
    assert "`ledgerd config --defaults` lists them" in msg  # zzz: nothing close
    notes: list[ConfigNote] = []
    cfg = load_config(BookieConfig, text='bookiePort = 3190\njournalDirectory = "/j"\n', env={},
                      notes=notes)
    assert cfg.bookie_port == 3190 and cfg.journal_directory == "/j"
    assert "<text>: BookKeeper's bookiePort = 3190 read as bookie_port = 3190" in map(str, notes)


def test_integer_ranges_print_as_integers() -> None:
    from ledgerd.appliance.config import BookieConfig as B
    from ledgerd.base.settings import _fields

    spec, kind, _ = _fields(B)["log_size_limit"]
    assert spec.describe(kind) == "int between 65536 and 1073741824"


def test_a_toml_file_named_conf_is_read_as_toml(tmp_path: Path) -> None:
    """A ledgerd TOML file named ``bookie.conf`` keeps its quoted strings and arrays (a
    properties reading would keep the quotes: a relative journal path named '"/..."')."""
    conf = tmp_path / "bookie.conf"
    conf.write_text('journal_directory = "/var/lib/ledgerd/journal"\n'
                    'ledger_directories = ["/d1", "/d2"]\nadmin_port = 0o17\n')
    cfg = load_config(BookieConfig, path=conf, env={})
    assert str(cfg.journal_directory) == "/var/lib/ledgerd/journal"
    assert [str(d) for d in cfg.ledger_directories] == ["/d1", "/d2"]
