"""The shipped unit and example configuration agree with the code."""

from __future__ import annotations

import configparser
from pathlib import Path

from ledgerd.appliance.config import BookieConfig
from ledgerd.base.settings import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_bookie_unit_runs_the_bookie_command_with_notify() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "systemd" / "ledgerd-bookie.service")
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["KillSignal"] == "SIGTERM"
    argv = service["ExecStart"].split()
    assert argv[0].endswith("/ledgerd") and argv[1:3] == ["bookie", "--conf"]
    assert int(service["WatchdogSec"]) > 0


def test_example_config_loads() -> None:
    cfg = load_config(BookieConfig, path=ROOT / "systemd" / "bookie.toml")
    assert len(cfg.ledger_directories) == 2 and cfg.admin_address == "127.0.0.1"


def test_autorecovery_unit_runs_the_standalone_command_with_notify() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "systemd" / "ledgerd-autorecovery.service")
    service = unit["Service"]
    assert service["Type"] == "notify"
    argv = service["ExecStart"].split()
    assert argv[0].endswith("/ledgerd") and argv[1:3] == ["autorecovery", "--conf"]


def test_gateway_unit_and_example_config() -> None:
    from ledgerd.kafka.config import GatewayConfig

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "systemd" / "ledgerd-gateway.service")
    service = unit["Service"]
    assert service["Type"] == "notify" and int(service["WatchdogSec"]) > 0
    argv = service["ExecStart"].split()
    assert argv[0].endswith("/ledgerd") and argv[1:4] == ["gateway", "--conf",
                                                          "/etc/ledgerd/gateway.toml"]
    cfg = load_config(GatewayConfig, path=ROOT / "systemd" / "gateway.toml")
    assert cfg.gateway_port == 9092 and cfg.throttle == 0


def test_snapshot_unit_prunes_by_verified_snapshots_not_by_age_alone() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "systemd" / "ledgerd-metadata-snapshot.service")
    service = unit["Service"]
    post = service["ExecStartPost"].split()
    assert post[0].endswith("/ledgerd") and post[1:4] == ["shell", "metadata", "prune"]
    assert post[post.index("--keep") + 1] == "${SNAPSHOT_KEEP}"
    env = dict(kv.split("=", 1) for kv in service["Environment"].split())
    assert int(env["SNAPSHOT_KEEP"]) >= 1 and float(env["SNAPSHOT_MAX_AGE_DAYS"]) > 0
