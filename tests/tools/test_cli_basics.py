"""The console script's foundation commands."""

from __future__ import annotations

import subprocess
import sys

from appliance.config import BookieConfig
from ledgerd.base.settings import load_config


def test_config_defaults_prints_loadable_toml() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.cli", "config", "--defaults"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert "journal_max_group_wait_ms = 0.0" in out
    assert "# BookKeeper: journalMaxGroupWaitMSec." in out
    assert load_config(BookieConfig, text=out, env={}) == load_config(BookieConfig, env={})


def test_version_prints() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "--version"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0
    assert "ledgerd" in proc.stdout


def test_bad_config_env_gives_one_line_error() -> None:
    import os
    env = dict(os.environ, LEDGERD_DISK_USAGE_THRESHOLD="lots")
    proc = subprocess.run(
        [sys.executable, "-c", "from tools.cli import main; from appliance.config import BookieConfig;"
         "from ledgerd.base.settings import load_config;"
         "import sys; sys.argv=['ledgerd','config','--defaults'];"
         "load_config(BookieConfig)"],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode != 0
    assert "LEDGERD_DISK_USAGE_THRESHOLD" in proc.stderr
