"""docs/testing.md's example runs as it is written: an application's test against a
real local cluster (``ledgerd.testing.process_cluster``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"docs/testing.md has {len(blocks)} python examples"
    return blocks[0]


def test_the_testing_docs_example_runs_against_a_real_local_cluster(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_example())
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ok", done.stdout
