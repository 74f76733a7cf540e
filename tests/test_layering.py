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
    "disk": {"native", "ledgerd.base", "wire"},
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
        "ledgerd.appliance.session", "ledgerd.appliance.replies",
        "ledgerd.base.logs", "ledgerd.base.credentials",
        "ledgerd.base.settings", "ledgerd.base.properties", "ledgerd.base.bknames"]
PURE += ["ledgerd.base.faultpoints", "ledgerd.testing.history"]  # the test kit's pure part
PURE += ["ledgerd.metadata.snapshot", "ledgerd.metadata.rebuild"]  # disaster recovery planning


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


# bench/ab.py runs a bench script from two trees: it imports the standard library only,
# none of either tree's code (nor bench/'s helpers, which import ledgerd).
def test_ab_imports_the_standard_library_only() -> None:
    targets = {t.split(".")[0] for _, t in imports_of(ROOT / "bench" / "ab.py")}
    assert targets and targets <= set(sys.stdlib_module_names) | {"__future__"}, targets


# -- storage engines (issue #46) --------------------------------------------------------
# disk/ reads the wire's entry header through ``wire.entry`` only (one id/LAC parser,
# derived from ``wire.layouts.ENTRY_HEADER``); the engines sit below ``disk.storage``:
# storage picks one in its factory, and no engine (nor compaction) imports storage.
DISK_MAY_IMPORT_FROM_WIRE = {"ledgerd.wire.entry", "ledgerd.wire.layouts"}
BELOW_STORAGE = ["entrystore", "interleaved", "dbstorage", "compaction", "entrylog", "index",
                 "dbindex", "writecache", "layouts", "lastmark", "maintenance"]


def test_disk_reads_only_the_entry_header_from_wire() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {target}"
             for path in sorted((ROOT / "disk").rglob("*.py"))
             for line, target in imports_of(path)
             if unit_of(target) == "wire" and target not in DISK_MAY_IMPORT_FROM_WIRE]
    assert found == []


@pytest.mark.parametrize("module", BELOW_STORAGE)
def test_storage_engines_sit_below_storage(module: str) -> None:
    path = ROOT / "disk" / f"{module}.py"
    assert path.exists(), path
    upward = [(line, t) for line, t in imports_of(path) if t == "ledgerd.disk.storage"]
    assert upward == []


# The bookie's connection: one sans-IO session below both transports. The session
# (and the replies it owes) import neither transport, and no trio or socket.
SESSION = ["ledgerd.appliance.session", "ledgerd.appliance.replies"]
TRANSPORTS = ["ledgerd.appliance.hub", "ledgerd.appliance.server"]


def _path_of(module: str) -> Path:
    return ROOT / Path(*module.split(".")[1:]).with_suffix(".py")


@pytest.mark.parametrize("module", SESSION)
def test_session_imports_neither_transport_nor_io(module: str) -> None:
    imported = {target for _, target in imports_of(_path_of(module))}
    assert not imported & set(TRANSPORTS)
    assert not {t for t in imported if t.split(".")[0] in ("trio", "socket", "select")}
    code = ("import sys; sys.modules['trio'] = None; sys.modules['kazoo'] = None; "
            f"import {module}")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("module", TRANSPORTS)
def test_both_transports_sit_on_the_session(module: str) -> None:
    imported = {target for _, target in imports_of(_path_of(module))}
    assert "ledgerd.appliance.session" in imported
    assert not imported & (set(TRANSPORTS) - {module})  # neither transport needs the other


# -- the client's write path goes one way (issue 46) ------------------------------------
# The client builds handles and logs; handles know it only as ``ClientServices`` and logs
# only as ``ledgerlog.LedgerClient``, so neither imports ``ledgerd.client``. Imports under
# ``if TYPE_CHECKING:`` count: a type-level circle is still a circle.
NOT_BELOW: dict[str, set[str]] = {
    "ledgerd.handles": {"ledgerd.client", "ledgerd.ledgerlog", "ledgerd.sync"},
    "ledgerd.ledgerlog": {"ledgerd.client", "ledgerd.sync"},
    "ledgerd.pipeline": {"ledgerd.client", "ledgerd.handles", "ledgerd.ledgerlog"},
    "ledgerd.bookies": {"ledgerd.client", "ledgerd.handles", "ledgerd.pipeline"},
    "ledgerd.bookie_client": {"ledgerd.client", "ledgerd.handles", "ledgerd.pipeline",
                              "ledgerd.bookies"},
}


def client_modules() -> dict[str, Path]:
    """The client unit's modules (``ledgerd`` minus the folders and the ground floor)."""
    return {module_name(p): p for p in sorted((ROOT / "ledgerd").rglob("*.py"))
            if unit_of(module_name(p)) == "ledgerd"}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_client_modules_import_each_other_one_way() -> None:
    modules = client_modules()
    graph = {m: {t for _, t in imports_of(p) if t in modules and t != m}
             for m, p in modules.items()}
    assert import_cycles(graph) == []
    for module, banned in NOT_BELOW.items():
        assert not graph[module] & banned, f"{module} imports {graph[module] & banned}"


def test_the_cycle_check_sees_a_circle() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(
    module_name(p) for p in (ROOT / "ledgerd" / "machines").glob("*.py")))
def test_every_machine_imports_without_trio(module: str) -> None:
    test_pure_module_imports_without_trio_or_kazoo(module)
