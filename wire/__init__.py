"""The wire protocol: frames declared with construct, status codes, digests, sans-IO connections.

Nothing in this package does I/O or imports trio. The pieces:

- :mod:`wire.layouts`: every byte layout, declared once with construct;
- :mod:`wire.codec`: fast ``struct`` codecs compiled from those declarations;
- :mod:`wire.messages`: the request and response dataclasses, api keys and flags;
- :mod:`wire.frames`: whole frames (header + body);
- :mod:`wire.connection`: sans-IO client and server connections;
- :mod:`wire.entry`: entry bytes, digests and master keys; :mod:`wire.entry_check`: how
  a reader that did not write an entry checks it, with the digest's key or without;
  :mod:`wire.compression`: zstd;
- :mod:`wire.status`: status codes and the one status <-> exception table.
"""

from ledgerd.wire.connection import (
    NEED_DATA,
    ClientConnection,
    ConnectionEnded,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    ServerConnection,
)
from ledgerd.wire.entry import Digester, DigestType, Entry, decode_entry, encode_entry, master_key
from ledgerd.wire.errors import WireError
from ledgerd.wire.messages import AddFlags, ApiKey, ReadFlags
from ledgerd.wire.status import BookieError, Status, error_for_status

__all__ = [
    "NEED_DATA", "AddFlags", "ApiKey", "BookieError", "ClientConnection", "ConnectionEnded",
    "DigestType", "Digester", "Entry", "ReadFlags", "RequestReceived", "RequestRejected",
    "ResponseReceived", "ServerConnection", "Status", "WireError", "decode_entry",
    "encode_entry", "error_for_status", "master_key",
]
