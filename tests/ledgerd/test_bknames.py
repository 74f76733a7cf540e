"""BookKeeper's configuration names: read in BookKeeper's units, never refused, documented.

Issue #48 item 3: ``readTimeout = 30`` (BookKeeper: 30 seconds) was a 30 ms timeout, and
``zkServers``, ``journalDir``, ``ledgerDir``, ``compactionRate`` and
``journalAdaptiveGroupWrites`` were refused as unknown keys.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from ledgerd.appliance.config import BookieConfig
from ledgerd.base.bknames import BOOKKEEPER_NAMES
from ledgerd.base.settings import (
    ConfigError,
    ConfigNote,
    bookkeeper_markdown,
    bookkeeper_table,
    bookkeeper_toml,
    load_config,
    unknown_environment,
)
from ledgerd.config import ClientConfig
from ledgerd.kafka.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]
BK_SERVER_CONF = Path(__file__).resolve().parent / "data" / "bk_server.conf"

# Every parameter of seed 001's tables (BookKeeper 4.4's "Bookie Configuration
# Parameters" and "BookKeeper Configuration Parameters"), with a value such as the
# documentation describes; each must load, mapped or ignored with a warning.
SEED_001_BOOKIE = {
    "bookiePort": 3181, "journalDirectory": "/tmp/bk-txn",
    "ledgerDirectories": "/tmp/bk1-data,/tmp/bk2-data", "indexDirectories": "/tmp/bk-idx",
    "bookieDeathWatchInterval": 1000, "gcWaitTime": 1000, "flushInterval": 100,
    "numAddWorkerThreads": 0, "numReadWorkerThreads": 8, "serverTcpNoDelay": True,
    "journalMaxSizeMB": 2048, "journalMaxBackups": 5, "journalPreAllocSizeMB": 16,
    "journalWriteBufferSizeKB": 64, "journalRemoveFromPageCache": True,
    "journalAdaptiveGroupWrites": True, "journalMaxGroupWaitMSec": 2,
    "journalBufferedWritesThreshold": 524288, "journalFlushWhenQueueEmpty": False,
    "numJournalCallbackThreads": 8, "openFileLimit": 900, "pageSize": 8192,
    "pageLimit": -1, "ledgerManagerType": "hierarchical", "zkLedgersRootPath": "/ledgers",
    "logSizeLimit": 1073741824, "entryLogFilePreallocationEnabled": True,
    "readBufferSizeBytes": 512, "writeBufferSizeBytes": 65536,
    "minorCompactionInterval": 3600, "minorCompactionThreshold": 0.2,
    "majorCompactionInterval": 86400, "majorCompactionThreshold": 0.8,
    "compactionMaxOutstandingRequests": 100000, "compactionRate": 1000,
    "enableStatistics": True, "openLedgerRereplicationGracePeriod": 30000,
    "readOnlyModeEnabled": True, "diskUsageThreshold": 0.95, "diskCheckInterval": 10000,
    "zkServers": "zk1:2181,zk2:2181,zk3:2181", "zkTimeout": 10000,
}
SEED_001_CLIENT = {
    "zkServers": "zk1:2181,zk2:2181,zk3:2181", "zkTimeout": 10000, "throttle": 5000,
    "readTimeout": 5, "numWorkerThreads": 4, "clientTcpNoDelay": True,
    "ledgerManagerType": "hierarchical", "zkLedgersRootPath": "/ledgers",
    "digestType": "CRC32", "passwd": "secret",
}


def _toml(values: dict[str, object]) -> str:
    def lit(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        return str(v)
    return "".join(f"{k} = {lit(v)}\n" for k, v in values.items())


def test_client_timeouts_are_read_in_seconds() -> None:
    cfg = load_config(ClientConfig, text="readTimeout = 30\n", env={})
    assert cfg.read_timeout_ms == 30_000 and cfg.add_entry_timeout_ms == 30_000
    cfg = load_config(ClientConfig, text="addEntryTimeoutSec = 30\n", env={})
    assert cfg.add_entry_timeout_ms == 30_000 and cfg.read_timeout_ms == 5000
    # readTimeout is BookKeeper's fallback for both: the specific names win, in any order
    cfg = load_config(ClientConfig, text="addEntryTimeoutSec = 2\nreadTimeout = 30\n"
                                         "readEntryTimeoutSec = 7\n", env={})
    assert (cfg.add_entry_timeout_ms, cfg.read_timeout_ms) == (2000, 7000)
    cfg = load_config(ClientConfig, overrides={"readTimeout": 1.5}, env={})
    assert cfg.read_timeout_ms == 1500
    # the ledgerd keys stay in their own unit
    assert load_config(ClientConfig, text="read_timeout_ms = 30\n", env={}).read_timeout_ms == 30


def test_bookie_names_are_read_in_bookkeeper_units_and_spellings() -> None:
    notes: list[ConfigNote] = []
    cfg = load_config(BookieConfig, text=(
        'zkServers = "zk1:2181,zk2:2181"\njournalDir = "/j"\nledgerDir = "/l1,/l2"\n'
        "compactionRate = 250\njournalAdaptiveGroupWrites = true\n"
        "minorCompactionInterval = -1\nmajorCompactionInterval = 0\n"
        "gcWaitTime = 300000\nflushInterval = 60000\nlocalScrubInterval = 3600\n"
        "logSizeLimit = 2147483648\n"
        'ledgerStorageClass = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"\n'),
        env={}, notes=notes)
    assert cfg.zk_servers == "zk1:2181,zk2:2181"
    assert cfg.journal_directory == "/j" and cfg.ledger_directories == ("/l1", "/l2")
    assert cfg.compaction_rate == 250
    assert (cfg.minor_compaction_interval_s, cfg.major_compaction_interval_s) == (0, 0)
    assert (cfg.gc_wait_time_ms, cfg.flush_interval_ms) == (300_000, 60_000)
    assert cfg.local_scrub_period_s == 3600 and cfg.ledger_storage_class == "db"
    assert cfg.log_size_limit == 1 << 30  # BookKeeper 4.4's 2 GB default: ledgerd's largest
    warnings = [n for n in notes if n.is_warning]
    assert [n.name for n in warnings] == ["journalAdaptiveGroupWrites"]
    assert "group commit cannot be turned off" in str(warnings[0])
    assert "\n" not in str(warnings[0])
    digest = load_config(ClientConfig, text='digestType = "MAC"\n', env={}).digest_type
    assert digest == "hmac"
    # BookKeeper binds an interface by name; ledgerd binds its address
    assert load_config(BookieConfig, text='listeningInterface = "lo"\n', env={}
                       ).listen_address == "127.0.0.1"
    assert load_config(BookieConfig, text='listeningInterface = "0.0.0.0"\n', env={}
                       ).listen_address == "0.0.0.0"


def test_metadata_service_uri_wins_over_zk_servers() -> None:
    text = ('metadataServiceUri = "zk+flat://a:2181;b:2181/cluster-1"\n'
            'zkServers = "old:2181"\nzkLedgersRootPath = "/old"\n')
    cfg = load_config(BookieConfig, text=text, env={})
    assert (cfg.zk_servers, cfg.zk_ledgers_root_path, cfg.ledger_manager_type) == \
        ("a:2181,b:2181", "/cluster-1", "flat")
    client = load_config(ClientConfig, text=text, env={})
    assert (client.zk_servers, client.zk_ledgers_root_path) == ("a:2181,b:2181", "/cluster-1")
    with pytest.raises(ConfigError, match="ledgerd keeps its metadata in ZooKeeper"):
        load_config(BookieConfig, text='metadataServiceUri = "etcd://e:2379/x"\n', env={})


@pytest.mark.parametrize(("cls", "values"), [(BookieConfig, SEED_001_BOOKIE),
                                             (ClientConfig, SEED_001_CLIENT)])
def test_every_seed_001_parameter_is_accepted(cls: type, values: dict[str, object]) -> None:
    table = bookkeeper_table(cls)
    assert not [n for n in values if n not in table], "a seed 001 name has no entry"
    notes: list[ConfigNote] = []
    load_config(cls, text=_toml(values), env={}, notes=notes)
    same = {f.name for f in dataclasses.fields(cls)}  # throttle: one name in both
    assert sorted(n.name for n in notes) == sorted(set(values) - same)  # each said what
    for note in notes:
        assert ("ignored: " in note.text) == table[note.name].is_ignored, note


def test_other_bookkeeper_names_warn_and_typos_are_refused() -> None:
    notes: list[ConfigNote] = []
    load_config(BookieConfig, text="numHighPriorityWorkerThreads = 8\n"
                                   "useHostNameAsBookieID = true\n", env={}, notes=notes)
    assert [(n.name, n.is_warning) for n in notes] == [
        ("numHighPriorityWorkerThreads", True), ("useHostNameAsBookieID", True)]
    notes.clear()  # a client's name in a bookie's file (one file for both, as some keep)
    load_config(BookieConfig, text="readTimeout = 30\n", env={}, notes=notes)
    assert [n.text for n in notes] == [
        "readTimeout ignored: a BookKeeper client setting, which a bookie has no use for "
        "(a ledgerd client reads the ones it maps: `ledgerd config --client`)"]
    with pytest.raises(ConfigError, match=r"did you mean 'journalDirectory'\?"):
        load_config(BookieConfig, text='journalDirectorys = "/j"\n', env={})
    with pytest.raises(ConfigError, match="a ledgerd bookie writes one journal"):
        load_config(BookieConfig, text='journalDirectories = "/j1,/j2"\n', env={})


def test_every_bookkeeper_name_a_setting_claims_is_read_as_that_setting() -> None:
    for cls in (BookieConfig, ClientConfig, GatewayConfig):
        table = bookkeeper_table(cls)
        fields = {f.name: f.metadata["spec"] for f in dataclasses.fields(cls)}
        for entry in table.values():
            assert all(k in fields or k == "ledger_manager_type" for k in entry.keys), entry
            assert entry.name in BOOKKEEPER_NAMES, f"{entry.name} is not BookKeeper's"
        for key, spec in fields.items():
            if spec.bk.isidentifier():
                assert spec.bk in table and key in table[spec.bk].keys, (cls, key, spec.bk)


def test_docs_list_every_name_and_how_it_is_read() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for cls in (BookieConfig, ClientConfig):
        assert bookkeeper_markdown(cls) in doc, f"regenerate the {cls.__name__} table"
    section = doc[doc.index("## Coming from BookKeeper"):]
    for name in {**SEED_001_BOOKIE, **SEED_001_CLIENT}:
        assert f"| `{name}` |" in section, name


def _conf(tmp_path: Path) -> Path:
    path = tmp_path / "bk_server.conf"
    path.write_text(BK_SERVER_CONF.read_text().replace("/tmp/", f"{tmp_path}/"))
    return path


def test_a_real_bk_server_conf_loads(tmp_path: Path) -> None:
    notes: list[ConfigNote] = []
    cfg = load_config(BookieConfig, path=_conf(tmp_path), env={}, notes=notes)
    assert cfg.bookie_port == 3181 and cfg.zk_servers == "localhost:2181"
    assert cfg.zk_ledgers_root_path == "/ledgers" and cfg.zk_timeout_ms == 30_000
    assert cfg.journal_directory == f"{tmp_path}/bk-txn"
    # a continued line, a \u escape, ':' and blank separators
    assert cfg.ledger_directories == (f"{tmp_path}/bk-data", f"{tmp_path}/bk-data2")
    assert cfg.index_directories == (f"{tmp_path}/bk-index",)
    assert cfg.journal_max_size_mb == 2048 and cfg.journal_max_group_wait_ms == 2.0
    assert cfg.flush_interval_ms == 60_000 and cfg.gc_wait_time_ms == 300_000
    assert cfg.major_compaction_interval_s == 0 and cfg.ledger_storage_class == "interleaved"
    assert cfg.admin_port == 8000
    ignored = {n.name for n in notes if n.is_warning}
    assert {"bookieDeathWatchInterval", "numAddWorkerThreads", "journalAdaptiveGroupWrites",
            "httpServerPort", "storage.range.store.dirs", "dlog.bkcEnsembleSize"} <= ignored


def test_from_bookkeeper_prints_toml_that_loads_to_the_same_config(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    text = bookkeeper_toml(BookieConfig, conf)
    tomllib.loads(text)
    assert "# bookieDeathWatchInterval = \"1000\": no death-watch thread" in text
    assert "\nledger_storage_class = \"interleaved\"\n" in text
    assert load_config(BookieConfig, text=text, env={}) == \
        load_config(BookieConfig, path=conf, env={})


def test_a_file_is_read_as_properties_by_name_or_content(tmp_path: Path) -> None:
    plain = tmp_path / "bookie.cfg"
    plain.write_text("# a BookKeeper file without the .conf name\nbookiePort=3190\n"
                     "journalDirectories=/data/bk/journal\nzkServers: zk1:2181\n")
    cfg = load_config(BookieConfig, path=plain, env={})
    assert (cfg.bookie_port, cfg.journal_directory, cfg.zk_servers) == \
        (3190, "/data/bk/journal", "zk1:2181")
    toml = tmp_path / "bookie.conf.toml"
    toml.write_text('bookie_port = 3191  # a comment\njournal_directory = "/j"\n')
    assert load_config(BookieConfig, path=toml, env={}).bookie_port == 3191


def test_unknown_environment_variables_are_named() -> None:
    env = {"LEDGERD_ZK_SERVER": "x", "LEDGERD_ZK_SERVERS": "y", "LEDGERD_FOO": "1",
           "LEDGERD_LOG_FORMAT": "json", "LEDGERD_GATEWAY_PORT": "9093", "PATH": "/bin"}
    lines = unknown_environment(env, (BookieConfig, ClientConfig, GatewayConfig),
                                ("LEDGERD_LOG_FORMAT",))
    assert lines == [
        "environment variable LEDGERD_FOO names no setting and is ignored",
        "environment variable LEDGERD_ZK_SERVER names no setting and is ignored; did you "
        "mean LEDGERD_ZK_SERVERS?"]


def test_bookie_port_zero_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BookieConfig, text="bookie_port = 0\n", env={})
    assert "bookie_port" in str(info.value) and "new bookie id, on every restart" in \
        str(info.value)
    with pytest.raises(ConfigError, match="on every restart"):
        BookieConfig(bookie_port=0)
    with pytest.raises(ConfigError, match="on every restart"):
        load_config(BookieConfig, text="bookiePort = 0\n", env={})


def test_log_levels_is_a_table_of_logger_levels() -> None:
    cfg = load_config(BookieConfig, text='log_levels = {"ledgerd.disk.journal" = "DEBUG", '
                                         '"kazoo" = "ERROR"}\nlog_file = "/tmp/x.log"\n',
                      env={})
    assert cfg.log_levels == (("kazoo", "ERROR"), ("ledgerd.disk.journal", "DEBUG"))
    env = {"LEDGERD_LOG_LEVELS": "ledgerd.disk.journal=DEBUG"}
    assert load_config(BookieConfig, env=env).log_levels == (("ledgerd.disk.journal", "DEBUG"),)
    with pytest.raises(ConfigError, match="log_levels"):
        load_config(BookieConfig, text='log_levels = {"ledgerd" = "LOUD"}\n', env={})
