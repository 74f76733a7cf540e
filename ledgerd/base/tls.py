"""TLS for every ledgerd endpoint: contexts from PEM files, principals from certificates.

One place builds the standard library's ``ssl.SSLContext`` for the bookie (server side),
the client and the tools, from PEM paths, so every endpoint has the same rules:

- protocols from a comma list (``TLSv1.2,TLSv1.3``: the lowest and highest allowed);
  cipher suites (OpenSSL names) for TLS 1.2 and below (Python's ``ssl`` offers no
  choice of TLS 1.3 suites);
- a server verifies client certificates against its trust file when client
  authentication is asked for (``required``: no certificate, no connection), and
  refuses one it cannot trust with the ``bad_certificate`` alert, as Java's TLS (a
  Kafka broker) does, where OpenSSL would pick an alert from the error
  (``refuse_as_bad_certificate``, through ``ledgerd.base._tls``, built from
  ``native/_tls_build.py``; the error itself
  is kept for the server's log, ``take_refusal``);
- a client verifies the bookie against its trust file, and its host name (or IP
  address, for ids like ``127.0.0.1:3181``) unless told not to.

A peer's principal is its certificate's subject common name; its roles come from the
organizational unit as BookKeeper's ``CertUtils`` writes them, ``0:role1,role2``
(code 0 = roles; ``1:cluster`` is ignored). :class:`ReloadingContext` rebuilds a context
when its files change (checked at most every ``refresh_s``), so certificates are rotated
without a restart; connections already open keep the context they started with.
"""

from __future__ import annotations

import ctypes
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ledgerd.base.errors import LedgerdError

__all__ = ["ANONYMOUS", "Principal", "ReloadingContext", "TlsConfigError", "client_context",
           "drain_decrypted", "pending_alert", "principal_of", "refuse_as_bad_certificate",
           "server_context", "take_refusal"]

_PROTOCOLS = {
    "TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


class TlsConfigError(LedgerdError, ValueError):
    """A TLS file or setting cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is on the other end: a name for the logs, and the roles it was given."""

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)
    authenticated: bool = False  # proved by a certificate (or a token)


ANONYMOUS = Principal("anonymous")


def _versions(protocols: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    names = [p.strip() for p in protocols.split(",") if p.strip()]
    bad = [n for n in names if n not in _PROTOCOLS]
    if bad or not names:
        raise TlsConfigError(f"tls_enabled_protocols: {protocols!r}: use a comma list of "
                             + ", ".join(_PROTOCOLS))
    chosen = sorted(_PROTOCOLS[n] for n in names)
    return chosen[0], chosen[-1]


def _readable(path: str, key: str) -> str:
    if not os.path.isfile(path):
        raise TlsConfigError(f"{key}: {path}: no such file")
    if not os.access(path, os.R_OK):
        raise TlsConfigError(f"{key}: {path}: not readable by this user")
    return path


def _common(ctx: ssl.SSLContext, protocols: str, ciphers: str) -> None:
    ctx.minimum_version, ctx.maximum_version = _versions(protocols)
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError as exc:
            raise TlsConfigError(f"tls_enabled_cipher_suites: {ciphers!r}: {exc}") from None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, cert_key: str, key_key: str) -> None:
    try:
        ctx.load_cert_chain(_readable(cert, cert_key), _readable(key, key_key) if key else None)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{cert_key}/{key_key}: {cert}, {key}: not a PEM certificate "
                             f"chain and its private key ({exc.reason or exc})") from None


def _load_trust(ctx: ssl.SSLContext, trust: str, key: str) -> None:
    try:
        ctx.load_verify_locations(cafile=_readable(trust, key))
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{key}: {trust}: not PEM CA certificates "
                             f"({exc.reason or exc})") from None


def server_context(certificate: str, key: str, *, trust: str = "", client_auth: str = "none",
                   protocols: str = "TLSv1.2,TLSv1.3", ciphers: str = "",
                   prefix: str = "") -> ssl.SSLContext:
    """A server context; ``client_auth`` is ``none``, ``optional`` or ``required``.
    Errors name the settings ``<prefix>tls_certificate_path`` and so on."""
    if not certificate:
        raise TlsConfigError(f"{prefix}tls_certificate_path is empty: a TLS server needs a "
                             "certificate")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(ctx, protocols, ciphers)
    _load_chain(ctx, certificate, key, f"{prefix}tls_certificate_path", f"{prefix}tls_key_path")
    if client_auth != "none":
        if not trust:
            raise TlsConfigError(f"{prefix}tls_trust_path is empty: verifying client "
                                 "certificates needs the CA that issued them")
        _load_trust(ctx, trust, f"{prefix}tls_trust_path")
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
        refuse_as_bad_certificate(ctx)
    return ctx


# -- refusing a client certificate with bad_certificate ----------------------------------

_refusal = threading.local()  # .reason: the last verification error reported in this thread


def _tls_helper() -> Any:
    try:
        from ledgerd.base import _tls  # type: ignore[attr-defined]
    except ImportError:  # built without a C compiler or libssl-dev: OpenSSL's alerts
        return None
    return _tls


_TLS = _tls_helper()
if _TLS is not None:
    @_TLS.ffi.def_extern()  # type: ignore[untyped-decorator]
    def ldn_tls_refused(error: int, depth: int) -> None:
        reason = _TLS.ffi.string(_TLS.lib.ldn_tls_error_string(error)).decode()
        _refusal.reason = f"{reason} (error {error}, certificate depth {depth})"


def take_refusal() -> str | None:
    """Why the last client certificate refused by a context of
    :func:`refuse_as_bad_certificate` was (the verification error OpenSSL found), once;
    read it right after the handshake failed, before any other handshake runs."""
    reason: str | None = getattr(_refusal, "reason", None)
    _refusal.reason = None
    return reason


# CPython's ``PySSLContext`` starts ``PyObject_HEAD; SSL_CTX *ctx;`` in every version
# checked (3.9 to 3.13); a debug build's traced references (``sys.getobjects``) widen
# the header, and other interpreters lay objects out otherwise
_KNOWN_LAYOUT = (sys.implementation.name == "cpython" and (3, 9) <= sys.version_info[:2]
                 <= (3, 13) and not hasattr(sys, "getobjects")
                 and object.__basicsize__ == 2 * ctypes.sizeof(ctypes.c_void_p))


def _ssl_ctx_pointer(ctx: ssl.SSLContext) -> int | None:
    """The ``SSL_CTX *`` of ``ctx`` (CPython keeps it right after the object header),
    or None unless the helper's libssl is the one ``ssl`` uses and the pointer reads
    back ``ctx``'s own verify mode and options."""
    if _TLS is None or _TLS.lib.ldn_tls_openssl_version() != ssl.OPENSSL_VERSION_NUMBER:
        return None
    if not _KNOWN_LAYOUT:
        return None  # another interpreter, or a build whose object header differs
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not pointer:
        return None
    raw = _TLS.ffi.cast("void *", pointer)
    mode = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}[ctx.verify_mode]
    if _TLS.lib.ldn_tls_ctx_verify_mode(raw) & 3 != mode or \
            _TLS.lib.ldn_tls_ctx_options(raw) != int(ctx.options):
        return None
    return pointer


def refuse_as_bad_certificate(ctx: ssl.SSLContext) -> bool:
    """Make ``ctx`` (a server's, verifying client certificates) refuse a certificate it
    cannot trust with the ``bad_certificate`` alert (42), as Java's TLS does; OpenSSL
    would send ``unknown_ca`` (48) for an unknown issuer, which some clients' checks
    (librdkafka's test 0097) do not take for a refused certificate. False, and ``ctx``
    unchanged, where the native helper is missing or does not match ``ssl``."""
    if type(ctx) is not ssl.SSLContext or ctx.protocol is not ssl.PROTOCOL_TLS_SERVER:
        return False  # only the standard library's own server contexts are read
    pointer = _ssl_ctx_pointer(ctx)
    if pointer is None:
        return False
    _TLS.lib.ldn_tls_refuse_as_bad_certificate(_TLS.ffi.cast("void *", pointer))
    return True


def client_context(trust: str, *, certificate: str = "", key: str = "",
                   verify_hostname: bool = True, protocols: str = "TLSv1.2,TLSv1.3",
                   ciphers: str = "") -> ssl.SSLContext:
    """A client context that verifies servers against ``trust`` (and presents
    ``certificate`` when given: mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(ctx, protocols, ciphers)
    _load_trust(ctx, trust, "tls_trust_path")
    ctx.check_hostname = verify_hostname
    if not verify_hostname:
        ctx.verify_mode = ssl.CERT_REQUIRED  # still a certificate from the trusted CA
    if certificate:
        _load_chain(ctx, certificate, key, "tls_certificate_path", "tls_key_path")
    return ctx


# What a reader asks a stream for. A 256 KiB ``recv`` cost ~25 us with 6 KB waiting and
# 133 us with 200 KB (each call allocates a fresh 256 KiB bytes object: an mmap and its
# page faults), against 6 and 17 us in 64 KiB ones (bench/RESULTS.md, fifth pass).
# ``SSLObject.read(n)`` allocates ``n`` bytes the same way, and a TLS record holds at most
# 16 KiB of plaintext.
RECEIVE_BYTES = 64 * 1024
TLS_RECORD_BYTES = 16 * 1024
TLS_DRAIN_BYTES = 256 * 1024


async def receive_available(stream: Any, *, tls: bool) -> bytes | bytearray:
    """One ``receive_some`` of a reader's loop, in sizes that allocate cheaply; over TLS,
    with the records already decryptable after it (``drain_decrypted``). Empty at the
    end of the stream."""
    if tls:
        first = await stream.receive_some(TLS_RECORD_BYTES)
        return drain_decrypted(stream, first, TLS_DRAIN_BYTES)
    data: bytes | bytearray = await stream.receive_some(RECEIVE_BYTES)
    return data


def drain_decrypted(stream: Any, first: bytes | bytearray, max_bytes: int) -> bytes | bytearray:
    """``first`` (what ``receive_some`` returned) plus whatever more is already
    decryptable, up to ``max_bytes``, without waiting.

    ``trio.SSLStream.receive_some`` returns one TLS record (16 KiB at most) per call, so a
    256 KiB burst of pipelined adds costs sixteen trips through trio's retry loop and
    locks; the records after the first are already in the stream's incoming buffer and
    decrypt with plain ``SSLObject.read`` calls. Measured (bench/tls.py): this is most of
    TLS's cost for batched adds. A stream without an ``_ssl_object`` (plain TCP) is
    returned as it was."""
    obj = getattr(stream, "_ssl_object", None)
    if obj is None or not first or len(first) >= max_bytes:
        return first
    chunks = [first]
    total = len(first)
    while total < max_bytes:
        try:
            more = obj.read(min(TLS_RECORD_BYTES, max_bytes - total))
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            break
        except ssl.SSLError:
            break  # the next receive_some raises it, through trio, as it should
        if not more:
            break
        chunks.append(more)
        total += len(more)
    return b"".join(chunks) if len(chunks) > 1 else first


def pending_alert(stream: Any) -> bytes:
    """What a ``trio.SSLStream`` whose handshake just failed had still to send: the TLS
    alert OpenSSL wrote saying why (unknown CA, certificate required, ...).

    trio marks the stream broken on the SSLError and leaves the alert in its outgoing
    memory BIO unsent, so the peer sees the connection close without a word; a server
    sends these bytes on the transport stream itself before closing. Empty for a stream
    without that BIO (plain TCP, or a trio that keeps it elsewhere)."""
    outgoing = getattr(stream, "_outgoing", None)
    return outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""


def _rdn(subject: Iterable[Any], name: str) -> list[str]:
    return [value for rdn in subject for (key, value) in rdn if key == name]


def principal_of(peercert: dict[str, Any] | None) -> Principal:
    """The principal of a verified peer certificate (``SSLObject.getpeercert()``);
    ANONYMOUS without one."""
    if not peercert:
        return ANONYMOUS
    subject = peercert.get("subject", ())
    names = _rdn(subject, "commonName")
    roles: set[str] = set()
    for ou in _rdn(subject, "organizationalUnitName"):
        for part in ou.split(";"):
            code, _, value = part.partition(":")
            if code.strip() == "0":
                roles.update(r.strip() for r in value.split(",") if r.strip())
    return Principal(names[0] if names else "unnamed-certificate", frozenset(roles), True)


class ReloadingContext:
    """``build()`` again when any of ``paths`` changed (mtime or size), checked at most
    every ``refresh_s`` seconds (0: never). A rebuild that fails keeps the old context
    and reports the error through ``on_error``."""

    def __init__(self, build: Callable[[], ssl.SSLContext], paths: Iterable[str],
                 refresh_s: float = 0.0,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        self._build = build
        self._paths = [p for p in paths if p]
        self.refresh_s = refresh_s
        self._on_error = on_error
        self.clock: Callable[[], float] = time.monotonic  # (tests move it on)
        self._stamp = self._stamps()
        self.context = build()
        self._checked = self.clock()
        self.reloads = 0

    def _stamps(self) -> tuple[tuple[float, int], ...]:
        out = []
        for p in self._paths:
            try:
                st = os.stat(p)
                out.append((st.st_mtime, st.st_size))
            except OSError:
                out.append((0.0, -1))
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        if self.refresh_s > 0 and self.clock() - self._checked >= self.refresh_s:
            self._checked = self.clock()
            stamp = self._stamps()
            if stamp != self._stamp:
                try:
                    self.context = self._build()
                    self._stamp = stamp
                    self.reloads += 1
                except (TlsConfigError, OSError, ssl.SSLError) as exc:
                    if self._on_error is not None:
                        self._on_error(exc)
        return self.context
