"""The floor plan, enforced: imports point down only, and the pure modules need no trio.

README's sentence, as a table: each unit may import only the units listed for it.
``ledgerd.base`` (logging, settings) is the ground floor; ``ledgerd`` means the client,
every ``ledgerd.*`` module but the ground floor. Imports under ``if TYPE_CHECKING:`` and
inside functions count too: a type-level cycle is still a cycle in the plan.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("wire", "native", "disk", "metadata", "ledgerd", "appliance", "tools")
ALLOWED: dict[str, set[str]] = {
    "ledgerd.base": set(),
    "wire": {"ledgerd.base"},
    "native": {"ledgerd.base"},  # the fault-point registry (ledgerd.base.faultpoints)
    "disk": {"native", "ledgerd.base"},
    "metadata": {"ledgerd.base"},
    "ledgerd": {"wire", "metadata", "ledgerd.base"},
    "appliance": {"wire", "native", "disk", "metadata", "ledgerd", "ledgerd.base"},
    "tools": {"wire", "native", "disk", "metadata", "ledgerd", "ledgerd.base", "appliance"},
}
# The test kit (ledgerd.testing, and the fault harness ledgerd.tools.faults with it) sits
# above everything it tests, and nothing else imports it.
TESTKIT = ("ledgerd.testing", "ledgerd.tools.faults")
ALLOWED["ledgerd.testing"] = {"wire", "native", "disk", "metadata", "ledgerd", "ledgerd.base",
                              "appliance", "tools"}
# Modules that must import without trio and kazoo (STYLE 4): the protocol, the formats,
# the metadata model, the client's decisions and the bookie's rules.
PURE = ["ledgerd.wire.layouts", "ledgerd.wire.codec", "ledgerd.wire.messages", "ledgerd.wire.frames", "ledgerd.wire.connection",
        "ledgerd.wire.entry", "ledgerd.wire.status", "ledgerd.wire.errors", "ledgerd.disk.journal_format", "ledgerd.metadata.ledger",
        "ledgerd.metadata.errors", "ledgerd.machines.writer", "ledgerd.machines.recovery",
        "ledgerd.machines.quorum", "ledgerd.machines.placement", "ledgerd.machines.changes",
        "ledgerd.machines.throttle", "ledgerd.machines.reads", "ledgerd.machines.recovery_run",
        "ledgerd.machines.checker", "ledgerd.appliance.core", "ledgerd.appliance.audit_schedule",
        "ledgerd.base.logs", "ledgerd.base.credentials",
        "ledgerd.base.settings"]
PURE += ["ledgerd.base.faultpoints", "ledgerd.testing.history"]  # the test kit's pure part


# The repository's top-level folders install as ``ledgerd.<folder>`` (pyproject's
# package-dir): ``ledgerd.wire`` is the unit "wire", and the rest of ``ledgerd`` the client.
FOLDERS = ("wire", "native", "disk", "metadata", "appliance", "tools")


def unit_of(module: str) -> str | None:
    if module == "ledgerd.base" or module.startswith("ledgerd.base."):
        return "ledgerd.base"
    if any(module == kit or module.startswith(kit + ".") for kit in TESTKIT):
        return "ledgerd.testing"
    parts = module.split(".")
    if parts[0] != "ledgerd":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "ledgerd"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "ledgerd" else ["ledgerd", *parts])


def imports_of(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "ledgerd":
            # `from ledgerd import native` imports the package ledgerd.native
            out += [(node.lineno, f"ledgerd.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def violations() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            here = unit_of(module_name(path))
            assert here is not None
            for line, target in imports_of(path):
                there = unit_of(target)
                if there is None or there == here:
                    continue
                if there not in ALLOWED[here]:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {target} "
                                 f"({there} is not below {here})")
    return found


def test_imports_point_down_only() -> None:
    assert violations() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from ledgerd.appliance.core import BookieCore\nimport ledgerd.wire.entry\n")
    assert [t for _, t in imports_of(bad)] == ["ledgerd.appliance.core", "ledgerd.wire.entry"]
    assert unit_of("ledgerd.appliance.core") not in ALLOWED["disk"]
    assert unit_of("ledgerd.base.logs") in ALLOWED["disk"]
    assert unit_of("ledgerd.client") not in ALLOWED["metadata"]
    assert unit_of(".".join(("wire", "entry"))) is None  # only ledgerd.wire is ours
    assert unit_of("ledgerd.testing.cluster") not in ALLOWED["tools"]
    assert unit_of("ledgerd.tools.faults.history") not in ALLOWED["ledgerd"]
    assert unit_of("ledgerd.testing.memory") not in ALLOWED["appliance"]


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_without_trio_or_kazoo(module: str) -> None:
    code = ("import sys; sys.modules['trio'] = None; sys.modules['kazoo'] = None; "
            f"import {module}")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
