"""SASL SCRAM (RFC 5802, RFC 7677) for the Kafka gateway, as a pure state machine.

:class:`ScramServer` takes the client's messages and returns the server's, with no
sockets: the gateway feeds it SaslAuthenticate's ``auth_bytes``. The exchange is

1. client-first ``n,,n=<user>,r=<client nonce>`` (gs2 header ``n,,``: no channel
   binding, no authzid other than empty);
2. server-first ``r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>``;
3. client-final ``c=biws,r=<combined nonce>,p=<base64 proof>``, the proof checked in
   constant time against the stored key;
4. server-final ``v=<base64 server signature>``, or ``e=<error>`` on failure.

A credential holds only the salt, iterations, StoredKey = H(HMAC(SaltedPassword,
"Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"): never the password
nor the salted password. An unknown user gets a fake credential (salt derived from a
per-server secret and the user name, as Kafka does), so the server-first message does
not tell whether the user exists; the exchange then fails at the proof like a wrong
password, with the same message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from enum import IntEnum

from ledgerd.base.errors import LedgerdError
from ledgerd.metadata.kafka_scram import ScramCredential

__all__ = ["MAX_ITERATIONS", "MIN_ITERATIONS", "SALT_BYTES", "Mechanism", "ScramClient",
           "ScramCredential", "ScramError", "ScramServer", "credential", "credential_from_salted",
           "salted_password"]

MIN_ITERATIONS = 4096   # Kafka's ScramMechanism.minIterations
MAX_ITERATIONS = 16384  # Kafka's ScramMechanism.maxIterations (the admin API's bound)
SALT_BYTES = 32  # a new credential's random salt


class Mechanism(IntEnum):
    """KIP-554's mechanism numbers (AlterUserScramCredentials' ``mechanism``)."""
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def sasl_name(self) -> str:
        return "SCRAM-SHA-256" if self is Mechanism.SCRAM_SHA_256 else "SCRAM-SHA-512"

    @property
    def hash_name(self) -> str:
        return "sha256" if self is Mechanism.SCRAM_SHA_256 else "sha512"

    @classmethod
    def from_sasl_name(cls, name: str) -> Mechanism | None:
        for m in cls:
            if m.sasl_name == name:
                return m
        return None


class ScramError(LedgerdError):
    """The exchange failed; ``str(self)`` is the message for the client."""


def _hmac(mech: Mechanism, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, mech.hash_name).digest()


def _h(mech: Mechanism, data: bytes) -> bytes:
    return hashlib.new(mech.hash_name, data).digest()


def salted_password(mech: Mechanism, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2 with the mechanism's HMAC. (SASLprep
    is not applied: Kafka's clients send the password's UTF-8 as it is.)"""
    return hashlib.pbkdf2_hmac(mech.hash_name, password.encode(), salt, iterations)


def credential_from_salted(mech: Mechanism, salt: bytes, iterations: int,
                           salted: bytes) -> ScramCredential:
    """The stored credential for a salted password (what AlterUserScramCredentials
    carries); the salted password itself is not kept."""
    client_key = _hmac(mech, salted, b"Client Key")
    return ScramCredential(salt, iterations, _h(mech, client_key),
                           _hmac(mech, salted, b"Server Key"))


def credential(mech: Mechanism, password: str, salt: bytes | None = None,
               iterations: int = MIN_ITERATIONS) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    return credential_from_salted(mech, salt, iterations,
                                  salted_password(mech, password, salt, iterations))


def _attrs(msg: str) -> list[tuple[str, str]]:
    out = []
    for part in msg.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("invalid-encoding")
        out.append((part[0], part[2:]))
    return out


def _unescape_name(name: str) -> str:
    # RFC 5802 saslname: "," as =2C and "=" as =3D; any other "=" is invalid
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i:i + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise ScramError("invalid-username-encoding")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


AUTH_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism"


class ScramServer:
    """One server side of one SCRAM exchange: :meth:`step` twice, then
    :attr:`user` is the authenticated user name. Any :class:`ScramError` ends it."""

    def __init__(self, mech: Mechanism,
                 lookup: Callable[[str], ScramCredential | None], *,
                 fake_secret: bytes, nonce: str | None = None) -> None:
        self.mech = mech
        self._lookup = lookup
        self._fake_secret = fake_secret
        self._server_nonce = nonce if nonce is not None else \
            base64.b64encode(secrets.token_bytes(18)).decode()
        self._state = "first"
        self._cred: ScramCredential | None = None
        self._known = False
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._name = ""
        self.user: str | None = None

    @property
    def done(self) -> bool:
        return self._state == "done"

    def step(self, message: bytes) -> bytes:
        """The server's answer to the client's next message."""
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            self._state = "failed"
            raise ScramError("invalid-encoding") from None
        if self._state == "first":
            return self._first(text).encode()
        if self._state == "final":
            return self._final(text).encode()
        raise ScramError("the SCRAM exchange is over")

    def _fake(self, name: str) -> ScramCredential:
        salt = _hmac(self.mech, self._fake_secret, name.encode())
        # an unknown user's keys match no proof: random, never kept
        return ScramCredential(salt, MIN_ITERATIONS, secrets.token_bytes(len(salt)),
                               secrets.token_bytes(len(salt)))

    def _first(self, text: str) -> str:
        self._state = "failed"
        if not text.startswith("n,"):
            # "y,," / "p=...": channel binding, which the gateway does not offer
            raise ScramError("channel-binding-not-supported")
        gs2_end = text.find(",", 2)
        if gs2_end < 0:
            raise ScramError("invalid-encoding")
        authzid = text[2:gs2_end]
        bare = text[gs2_end + 1:]
        attrs = _attrs(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise ScramError("invalid-encoding")
        if any(k == "m" for k, _ in attrs):
            raise ScramError("extensions-not-supported")
        name = _unescape_name(attrs[0][1])
        if authzid and authzid != "a=" + attrs[0][1]:
            raise ScramError("invalid-username-encoding")
        if not name:
            raise ScramError("invalid-username-encoding")
        cred = self._lookup(name)
        self._known = cred is not None
        self._cred = cred if cred is not None else self._fake(name)
        self._name = name
        self._client_first_bare = bare
        self._nonce = attrs[1][1] + self._server_nonce
        self._server_first = (f"r={self._nonce},s={base64.b64encode(self._cred.salt).decode()}"
                              f",i={self._cred.iterations}")
        self._state = "final"
        return self._server_first

    def _final(self, text: str) -> str:
        self._state = "failed"
        assert self._cred is not None
        idx = text.rfind(",p=")
        if idx < 0:
            raise ScramError("invalid-encoding")
        without_proof = text[:idx]
        attrs = _attrs(without_proof)
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("invalid-encoding")
        if attrs[0][1] != "biws":  # base64("n,,")
            raise ScramError("channel-bindings-dont-match")
        # Kafka 3.x checks that the nonce *ends with* the combined one (Kafka 4 wants it
        # equal): librdkafka before 2.6.1 (Debian's kcat among its users) sends its
        # own nonce twice, ``r=<client nonce><client nonce><server nonce>``. The proof
        # covers the message as sent, so the server's nonce is still in what it signs.
        sent = attrs[1][1]
        if not hmac.compare_digest(sent[-len(self._nonce):].encode(), self._nonce.encode()):
            raise ScramError("invalid-proof")
        try:
            proof = base64.b64decode(text[idx + 3:], validate=True)
        except ValueError:
            raise ScramError("invalid-encoding") from None
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode()
        signature = _hmac(self.mech, self._cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("invalid-proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        ok = hmac.compare_digest(_h(self.mech, client_key), self._cred.stored_key)
        if not ok or not self._known:
            raise ScramError("invalid-proof")
        self.user = self._name
        self._state = "done"
        server_sig = _hmac(self.mech, self._cred.server_key, auth_message)
        return "v=" + base64.b64encode(server_sig).decode()


class ScramClient:
    """The client side, for tests and the gateway's own tools."""

    def __init__(self, mech: Mechanism, user: str, password: str,
                 nonce: str | None = None) -> None:
        self.mech = mech
        self.user = user
        self.password = password
        self.nonce = nonce if nonce is not None else secrets.token_urlsafe(18)
        self._bare = ""
        self._server_sig = b""

    def first(self) -> bytes:
        name = self.user.replace("=", "=3D").replace(",", "=2C")
        self._bare = f"n={name},r={self.nonce}"
        return ("n,," + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(_attrs(server_first.decode()))
        nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        if not nonce.startswith(self.nonce):
            raise ScramError("invalid nonce")
        salted = salted_password(self.mech, self.password, salt, iterations)
        client_key = _hmac(self.mech, salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        auth_message = ",".join((self._bare, server_first.decode(), without_proof)).encode()
        sig = _hmac(self.mech, _h(self.mech, client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=False))
        self._server_sig = _hmac(self.mech, _hmac(self.mech, salted, b"Server Key"),
                                 auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        text = server_final.decode()
        if text.startswith("e="):
            raise ScramError(text[2:])
        if not hmac.compare_digest(text, "v=" + base64.b64encode(self._server_sig).decode()):
            raise ScramError("server signature mismatch")
