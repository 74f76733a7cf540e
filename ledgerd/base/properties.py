"""Java properties files (BookKeeper's ``bk_server.conf``), read without a JVM.

The grammar is ``java.util.Properties.load``'s, which BookKeeper's configuration
library (commons-configuration) follows for everything a ``bk_server.conf`` uses:

* a line whose first non-blank character is ``#`` or ``!`` is a comment;
* a line ending in an odd number of backslashes continues on the next, whose leading
  blanks are dropped;
* the key ends at the first unescaped ``=``, ``:`` or blank; blanks around one ``=`` or
  ``:`` are dropped, and the rest of the line is the value, unquoted (``key value``
  with no separator is legal too);
* ``\\t \\n \\r \\f \\uXXXX`` are escapes; a backslash before any other character
  stands for that character (``\\=``, ``\\:``, ``\\ ``, ``\\\\``).

Values stay strings: ``a,b`` is one string here, and a list only where the setting
it names is a list (commons-configuration splits on commas the same way). A key given
twice keeps its last value, as ``java.util.Properties`` does.
"""

from __future__ import annotations

from ledgerd.base.errors import LedgerdError

__all__ = ["PropertiesError", "looks_like_properties", "parse_properties"]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_BLANK = " \t\f"


class PropertiesError(LedgerdError, ValueError):
    """A line that is not a property (an unfinished ``\\u`` escape)."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, logical line), comments and blank lines dropped."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.lstrip(_BLANK)
        if not pending:
            if not line or line[0] in "#!":
                continue
            start = number
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((start, "".join(pending)))
        pending = []
    if pending:
        out.append((start, "".join(pending)))
    return out


def _unescape(text: str, line: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        n = text[i + 1]
        if n == "u":
            digits = text[i + 2:i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise PropertiesError(line, f"bad unicode escape \\u{digits}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(n, n))
        i += 2
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """The raw (still escaped) key and value of one logical line."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c in _BLANK:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_BLANK)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_BLANK)
    return key, rest


def parse_properties(text: str) -> dict[str, tuple[int, str]]:
    """``{key: (line number, value)}`` of a properties file's text (the last of a
    repeated key wins). Raises PropertiesError naming the line of a bad escape."""
    out: dict[str, tuple[int, str]] = {}
    for number, line in _logical_lines(text):
        raw_key, raw_value = _split(line)
        key = _unescape(raw_key, number)
        out.pop(key, None)  # a repeated key moves to its last place, as it is read last
        out[key] = (number, _unescape(raw_value, number))
    return out


def looks_like_properties(text: str) -> bool:
    """True when ``text`` reads as a properties file rather than TOML: some property
    line has an unquoted value (``journalDirectories=/tmp/bk-txn``) or a ``:``/blank
    separator, which TOML does not allow."""
    for _number, line in _logical_lines(text):
        if line.startswith("["):
            return False
        if line[0] in "\"']}":  # inside a TOML array or inline table
            continue
        key, value = _split(line)
        sep = line[len(key):].lstrip(_BLANK)[:1]
        if sep != "=":
            return True
        v = value.split("#", 1)[0].strip()
        if not v:
            return True
        if v[0] in "\"'[{" or v in ("true", "false"):
            continue
        try:
            float(v.replace("_", ""))
        except ValueError:
            return True
    return False
