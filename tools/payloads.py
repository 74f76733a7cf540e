"""How the shell shows an entry's payload: never raw bytes on a terminal.

``text`` (the default) decodes UTF-8 and escapes what a terminal would act on (control
characters, escape sequences) and what is not UTF-8 (``\\xNN``), so a payload cannot move
the cursor or change colours; ``hex`` and ``base64`` show every byte. Text is for
reading; the lossless forms are ``hex``, ``base64`` and the ``payload_base64`` field
every ``--json`` row carries (``base64.b64decode`` gives back the exact bytes).
"""

from __future__ import annotations

import base64

__all__ = ["FORMATS", "json_fields", "render"]

FORMATS = ("text", "hex", "base64")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def render(payload: bytes, fmt: str = "text") -> str:
    """``payload`` as one line of printable characters, in ``fmt`` (one of FORMATS)."""
    if fmt == "hex":
        return payload.hex()
    if fmt == "base64":
        return base64.b64encode(payload).decode("ascii")
    if fmt != "text":
        raise ValueError(f"payload format {fmt!r}: one of {', '.join(FORMATS)}")
    text = payload.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else _NAMED.get(c) or
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def json_fields(payload: bytes, fmt: str = "text") -> dict[str, str]:
    """The payload fields of a ``--json`` row: ``payload`` as ``render`` shows it, and
    ``payload_base64``, the exact bytes."""
    return {"payload": render(payload, fmt),
            "payload_base64": base64.b64encode(payload).decode("ascii")}
