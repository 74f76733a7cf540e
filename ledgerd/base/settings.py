"""Settings machinery: frozen dataclasses loaded from TOML, environment and flags.

The ground floor under every package that has settings (bookie, client, gateway); it
knows nothing of any of them.

Every setting is declared once with :func:`setting`, which records its BookKeeper name
(``journal_max_group_wait_ms`` = ``journalMaxGroupWaitMSec``), a one-line description and
the values it allows. The same declarations drive loading, validation, the commented
defaults file (``ledgerd config --defaults``) and the table in docs/configuration.md.

Precedence, lowest first: the dataclass default, the TOML file, ``LEDGERD_<KEY>``
environment variables, then explicit overrides (CLI flags). Unknown keys and bad values
raise :class:`ConfigError`, which names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ledgerd.base.bknames import BkName, bk_table, known_reason
from ledgerd.base.errors import LedgerdError
from ledgerd.base.properties import PropertiesError, looks_like_properties, parse_properties

__all__ = [
    "LOG_LEVELS",
    "ConfigError",
    "ConfigNote",
    "Spec",
    "bookkeeper_markdown",
    "bookkeeper_table",
    "bookkeeper_toml",
    "check_log_level",
    "defaults_toml",
    "load_config",
    "markdown_table",
    "setting",
    "toml_value",
    "unknown_environment",
]

ENV_PREFIX = "LEDGERD_"
# commons-configuration's spellings, which BookKeeper's files use
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
          "on": True, "off": False}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(LedgerdError, ValueError):
    """A configuration value was unknown, of the wrong type or out of range."""

    def __init__(self, key: str, value: object, allowed: str, source: str = "") -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        self.problems: list[ConfigError] = [self]
        where = f" (from {source})" if source else ""
        super().__init__(f"config key {key!r}{where}: got {value!r}; allowed: {allowed}")

    @classmethod
    def several(cls, problems: list[ConfigError]) -> ConfigError:
        """One error reporting every problem found (the first's key and value)."""
        if len(problems) == 1:
            return problems[0]
        first = problems[0]
        err = cls(first.key, first.value, first.allowed, first.source)
        err.problems = list(problems)
        err.args = (f"{len(problems)} config problems: "
                    + "; ".join(str(p) for p in problems),)
        return err


@dataclass(frozen=True, slots=True)
class ConfigNote:
    """A BookKeeper name read as a ledgerd setting, or accepted and ignored (``warning``):
    one line for ``ledgerd config --check`` and the bookie's start-up log."""

    source: str
    name: str
    text: str
    is_warning: bool

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


@dataclass(frozen=True, slots=True)
class Spec:
    """What one setting allows; attached to the dataclass field's metadata."""

    bk: str
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    why_minimum: str = ""  # why a smaller value is refused, when that is not obvious

    def describe(self, kind: str) -> str:
        parts = [kind]
        if self.choices is not None:
            parts = ["one of " + ", ".join(repr(c) for c in self.choices)]

        def num(v: float) -> str:
            return str(int(v)) if kind == "int" else f"{v:g}"
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"between {num(self.minimum)} and {num(self.maximum)}")
        elif self.minimum is not None:
            parts.append(f">= {num(self.minimum)}")
        elif self.maximum is not None:
            parts.append(f"<= {num(self.maximum)}")
        return " ".join(parts)


def setting(
    default: Any,
    *,
    bk: str,
    doc: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    why_minimum: str = "",
) -> Any:
    """Declare a setting with its default, BookKeeper name and allowed values."""
    spec = Spec(bk=bk, doc=doc, minimum=minimum, maximum=maximum, choices=choices,
                why_minimum=why_minimum)
    return dataclasses.field(default=default, metadata={"spec": spec})


def _field_kind(tp: Any) -> str:
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "str"
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if args and typing.get_origin(args[0]) is tuple:
            return "table"  # tuple[tuple[str, str], ...]: a TOML inline table of strings
        return "list[str]"
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"optional settings are not supported: {tp}")
    raise TypeError(f"unsupported setting type {tp}")


def _coerce(key: str, kind: str, value: object, source: str, *, lenient: bool = False) -> object:
    """Check a TOML value's type, without range checks. ``lenient``: a string is
    converted (environment variables, properties files, BookKeeper names)."""
    from_env = lenient or source.startswith("env")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if from_env and isinstance(value, str) and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ConfigError(key, value, "true or false", source)
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and from_env:
            return int(value)
        if from_env and isinstance(value, str):
            try:
                return int(value.strip(), 0)
            except ValueError:
                pass
        raise ConfigError(key, value, "an integer", source)
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_env and isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(key, value, "a number", source)
    if kind == "str":
        if isinstance(value, str):
            return value.strip() if from_env else value
        raise ConfigError(key, value, "a string", source)
    if kind == "table":
        # {"name" = "value", ...} kept as sorted (name, value) pairs (a frozen config
        # holds no dict); from the environment: name=value,name=value.
        if from_env and isinstance(value, str):
            pairs = [p.partition("=") for p in value.split(",") if p.strip()]
            if all(sep for _n, sep, _v in pairs):
                return tuple(sorted((n.strip(), v.strip()) for n, _s, v in pairs))
        if isinstance(value, (list, tuple)) and not value:
            return ()
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items()):
            return tuple(sorted(value.items()))
        if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2
                                            for p in value):
            return tuple(sorted(value))
        raise ConfigError(key, value, 'a table of strings, {"name" = "value", ...}', source)
    if kind == "list[str]":
        if from_env and isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(key, value, "a list of strings", source)
    raise AssertionError(kind)


def _check_range(key: str, spec: Spec, kind: str, value: object, source: str) -> None:
    allowed = spec.describe(kind)
    if spec.why_minimum and spec.minimum is not None and isinstance(value, (int, float)) \
            and value < spec.minimum:
        raise ConfigError(key, value, f"{allowed} ({spec.why_minimum})", source)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(key, value, allowed, source)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if spec.minimum is not None and value < spec.minimum:
            raise ConfigError(key, value, allowed, source)
        if spec.maximum is not None and value > spec.maximum:
            raise ConfigError(key, value, allowed, source)


C = TypeVar("C")


def _fields(cls: type[Any]) -> dict[str, tuple[Spec, str, Any]]:
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Spec, str, Any]] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("spec")
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        out[f.name] = (spec, _field_kind(hints[f.name]), f.default)
    return out


def _read_file(path: str | os.PathLike[str]) -> tuple[str, dict[str, object], bool]:
    """(source, layer, is_properties) of a TOML file or a BookKeeper properties file.

    A file that parses as TOML is TOML, whatever its name (a ledgerd ``bookie.conf``
    keeps its quoted strings and arrays); ``.toml`` must. Otherwise ``.conf`` and
    ``.properties`` files (``bk_server.conf``), and files whose text reads as properties
    (an unquoted value, a ``:`` separator), are Java properties files."""
    source = os.fspath(path)
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("<file>", source, f"a readable TOML file ({exc.strerror})") from exc
    suffix = Path(source).suffix.lower()
    try:
        return source, tomllib.loads(raw), False
    except tomllib.TOMLDecodeError as exc:
        if suffix == ".toml" or (suffix not in (".conf", ".properties")
                                 and not looks_like_properties(raw)):
            raise ConfigError("<file>", source, f"valid TOML ({exc})") from exc
    try:
        props = parse_properties(raw)
    except PropertiesError as exc:
        raise ConfigError("<file>", source, f"a Java properties file ({exc})") from exc
    return source, {k: v for k, (_line, v) in props.items()}, True


def bookkeeper_table(cls: type[Any]) -> dict[str, BkName]:
    """The BookKeeper names ``cls`` reads (its ``bookkeeper_names``), by name."""
    return bk_table(getattr(cls, "bookkeeper_names", ()))


def _translate(
    cls: type[Any],
    layer: Mapping[str, object],
    source: str,
    notes: list[ConfigNote],
    problems: list[ConfigError],
) -> list[tuple[str, object, str]]:
    """A file's keys as ``(ledgerd key, value, source)``, BookKeeper names translated.

    A weak BookKeeper name (``zkServers`` beside ``metadataServiceUri``) comes first so
    the name that BookKeeper lets win wins here too; an ignored name adds a warning
    note; an unknown name adds a problem with the closest key."""
    fields = _fields(cls)
    table = bookkeeper_table(cls)
    out: list[tuple[str, object, str]] = []
    items = sorted(layer.items(), key=lambda kv: not (kv[0] in table and table[kv[0]].weak))
    for name, value in items:
        if name in fields:
            out.append((name, value, source))
            continue
        entry = table.get(name)
        if entry is not None and not entry.is_ignored:
            try:
                keys = entry.translate(value)
            except ValueError as exc:
                problems.append(ConfigError(name, value, str(exc), source))
                continue
            keys = {k: v for k, v in keys.items() if k in fields}
            shown = ", ".join(f"{k} = {_show(v)}" for k, v in keys.items())
            unit = f" ({entry.unit})" if entry.unit else ""
            notes.append(ConfigNote(source, name, f"BookKeeper's {name} = {_show(value)}{unit} "
                                    f"read as {shown}", False))
            out.extend((k, v, f"{source}: {name}") for k, v in keys.items())
            continue
        reason = known_reason(name, table)
        if reason is not None:
            notes.append(ConfigNote(source, name, f"{name} ignored: {reason}", True))
            continue
        close = difflib.get_close_matches(name, [*fields, *table], n=1, cutoff=0.6)
        hint = ("a known key" + (f": did you mean {close[0]!r}?" if close else
                                  " (`ledgerd config --defaults` lists them)"))
        problems.append(ConfigError(name, value, hint, source))
    return out


def _show(value: object) -> str:
    """A value as a note shows it: strings as written (a properties file's values are
    all strings), the rest as TOML."""
    return value if isinstance(value, str) else toml_value(_plain(value))


def _plain(value: object) -> object:
    return value if isinstance(value, (bool, int, float, str, list, tuple)) else str(value)


def load_config(
    cls: type[C],
    *,
    path: str | os.PathLike[str] | None = None,
    text: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    notes: list[ConfigNote] | None = None,
) -> C:
    """Build ``cls`` from defaults, a file or text, ``LEDGERD_*`` env and overrides.

    ``path`` is a TOML file or a BookKeeper properties file (``bk_server.conf``, see
    :func:`_read_file`). BookKeeper names in either are read through the class's
    ``bookkeeper_names`` table, in BookKeeper's units; what each did is appended to
    ``notes`` (the caller prints or logs them: ``ledgerd config --check`` and the
    bookie's start-up log do).

    Raises ConfigError naming the key, the value and what is allowed; a TOML syntax
    error names the file. Environment variables that match no key of ``cls`` are
    ignored here (the same environment serves bookie and client;
    :func:`unknown_environment` finds those that match no process's key), but unknown
    keys in the file or in ``overrides`` are errors.
    """
    fields = _fields(cls)
    values: dict[str, object] = {}
    found: list[ConfigNote] = []
    problems: list[ConfigError] = []
    entries: list[tuple[str, object, str, bool]] = []  # key, value, source, lenient
    if path is not None:
        source, layer, is_properties = _read_file(path)
        entries += [(k, v, src, is_properties or src != source)
                    for k, v, src in _translate(cls, layer, source, found, problems)]
    if text is not None:
        try:
            layer = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("<text>", text[:40], f"valid TOML ({exc})") from exc
        entries += [(k, v, src, src != "<text>")
                    for k, v, src in _translate(cls, layer, "<text>", found, problems)]
    environ = os.environ if env is None else env
    for name, text_value in environ.items():
        key = name[len(ENV_PREFIX):].lower()
        if name.startswith(ENV_PREFIX) and key in fields:
            entries.append((key, text_value, f"env {name}", True))
    if overrides:
        entries += [(k, v, src, src != "override")
                    for k, v, src in _translate(cls, dict(overrides), "override", found,
                                                problems)]
    for key, value, src, lenient in entries:
        spec, kind, _ = fields[key]
        try:
            coerced = _coerce(key, kind, value, src, lenient=lenient)
            _check_range(key, spec, kind, coerced, src)
        except ConfigError as exc:
            problems.append(exc)
            continue
        values[key] = coerced
    if notes is not None:
        notes.extend(found)
    if problems:
        # and what the checks across keys say with the bad values left at their
        # defaults, so one --check lists that too (only the first it finds)
        try:
            cls(**values)
        except ConfigError as exc:
            if exc.key not in {p.key for p in problems}:
                problems.append(exc)
        except (TypeError, ValueError):
            pass
        raise ConfigError.several(problems)
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("<combined>", values, str(exc)) from exc


def bookkeeper_toml(cls: type[Any], path: str | os.PathLike[str]) -> str:
    """The ledgerd TOML equivalent of a BookKeeper configuration file for ``cls``: each
    key set with the BookKeeper line it came from as a comment, then a comment per name
    ignored and why. Raises ConfigError (every problem) as :func:`load_config` does."""
    source, layer, is_properties = _read_file(path)
    fields = _fields(cls)
    notes: list[ConfigNote] = []
    problems: list[ConfigError] = []
    values: dict[str, object] = {}
    origins: dict[str, list[str]] = {}
    for key, value, src in _translate(cls, layer, source, notes, problems):
        spec, kind, _ = fields[key]
        try:
            coerced = _coerce(key, kind, value, src, lenient=is_properties or src != source)
            _check_range(key, spec, kind, coerced, src)
        except ConfigError as exc:
            problems.append(exc)
            continue
        values[key] = coerced
        name = src.split(": ", 1)[1] if ": " in src else key
        origins.setdefault(key, []).append(f"{name} = {toml_value(_plain(layer[name]))}")
    if problems:
        raise ConfigError.several(problems)
    try:
        cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError("<combined>", values, str(exc)) from exc
    lines = [f"# ledgerd {cls.__name__} translated from {source}",
             "# (`ledgerd config --from-bookkeeper`; docs/configuration.md says how each "
             "BookKeeper name is read)", ""]
    for key in fields:
        if key in values:
            lines.append(f"# {source}: " + "; ".join(origins[key]))
            lines.append(f"{key} = {toml_value(values[key])}")
    ignored = [n for n in notes if n.is_warning]
    if ignored:
        lines += ["", f"# {len(ignored)} name(s) of {source} ledgerd does not use:"]
        lines += [f"# {n.name} = {toml_value(_plain(layer[n.name]))}: "
                  f"{n.text.split(' ignored: ', 1)[-1]}" for n in ignored]
    return "\n".join(lines) + "\n"


def unknown_environment(environ: Mapping[str, str], classes: tuple[type[Any], ...],
                        others: tuple[str, ...] = ()) -> list[str]:
    """One warning line per ``LEDGERD_*`` variable that names no key of ``classes`` and
    is not one of ``others`` (variables read elsewhere, such as ``LEDGERD_LOG_FORMAT``),
    with the closest key when one is close."""
    keys = sorted({k for cls in classes for k in _fields(cls)})
    lines = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in others:
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key in keys:
            continue
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.7)
        hint = f"; did you mean {ENV_PREFIX}{close[0].upper()}?" if close else ""
        lines.append(f"environment variable {name} names no setting and is ignored{hint}")
    return lines


def toml_value(value: object) -> str:
    """``value`` as a TOML literal (bool, number, string, a list of those, or a table:
    a dict or a table setting's (name, value) pairs)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        for char, escape in (("\n", "\\n"), ("\t", "\\t"), ("\r", "\\r")):
            escaped = escaped.replace(char, escape)
        return '"' + escaped + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_value(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, tuple) and value and all(isinstance(p, tuple) and len(p) == 2
                                                  for p in value):
        return toml_value(dict(value))  # a table setting's (name, value) pairs
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def defaults_toml(cls: type[Any]) -> str:
    """A commented TOML file listing every key of ``cls`` with its default."""
    lines = [f"# ledgerd {cls.__name__}: every key with its default value.", ""]
    for name, (spec, kind, default) in _fields(cls).items():
        lines.append(f"# {spec.doc}")
        # a name of BookKeeper's, or one in parentheses naming its own origin
        # ("(Kafka: num.partitions)", "(ledgerd: ...)")
        origin = spec.bk[1:-1] if spec.bk.startswith("(") and spec.bk.endswith(")") \
            else f"BookKeeper: {spec.bk}"
        lines.append(f"# {origin}. Allowed: {spec.describe(kind)}.")
        lines.append(f"{name} = {toml_value(default)}")
        lines.append("")
    return "\n".join(lines)


def markdown_table(cls: type[Any]) -> str:
    """The docs/configuration.md table for ``cls``."""
    rows = ["| key | BookKeeper | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, (spec, kind, default) in _fields(cls).items():
        rows.append(
            f"| `{name}` | `{spec.bk}` | `{toml_value(default)}` | "
            f"{spec.describe(kind)} | {spec.doc} |"
        )
    return "\n".join(rows)


def bookkeeper_markdown(cls: type[Any]) -> str:
    """The docs/configuration.md table of the BookKeeper names ``cls`` reads: each
    name, and the ledgerd setting it sets in which unit, or why it is ignored."""
    rows = ["| BookKeeper name | what ledgerd does with it |", "|---|---|"]
    for entry in sorted(bookkeeper_table(cls).values(), key=lambda e: e.name.lower()):
        rows.append(f"| `{entry.name}` | {entry.describe(_fields(cls))} |")
    return "\n".join(rows)


def check_log_level(value: str) -> None:
    if value not in LOG_LEVELS:
        raise ConfigError("log_level", value, "one of " + ", ".join(LOG_LEVELS))
