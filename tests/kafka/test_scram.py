"""The SCRAM state machine (ledgerd/kafka/scram.py) without sockets: RFC 7677's
published SCRAM-SHA-256 exchange, a SCRAM-SHA-512 round trip, and the failures (wrong
password, unknown user looking the same, bad channel binding, replayed nonce)."""

from __future__ import annotations

import base64

import pytest

from ledgerd.kafka.scram import (
    Mechanism,
    ScramClient,
    ScramCredential,
    ScramError,
    ScramServer,
    credential,
    credential_from_salted,
    salted_password,
)

SECRET = b"fake-salt-secret"

# RFC 7677 section 3
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _server(mech: Mechanism, creds: dict[str, ScramCredential],
            nonce: str | None = None) -> ScramServer:
    return ScramServer(mech, creds.get, fake_secret=SECRET, nonce=nonce)


def test_rfc7677_vector_server_side() -> None:
    cred = credential(Mechanism.SCRAM_SHA_256, "pencil", RFC_SALT, 4096)
    server = _server(Mechanism.SCRAM_SHA_256, {"user": cred}, RFC_SERVER_NONCE)
    assert server.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.done and server.user == "user"


def test_rfc7677_vector_client_side() -> None:
    client = ScramClient(Mechanism.SCRAM_SHA_256, "user", "pencil",
                         nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.check(RFC_SERVER_FINAL)


def test_stored_keys_from_salted_password_match_the_password_path() -> None:
    salted = salted_password(Mechanism.SCRAM_SHA_512, "secret", b"salt", 8192)
    via_salted = credential_from_salted(Mechanism.SCRAM_SHA_512, b"salt", 8192, salted)
    assert via_salted == credential(Mechanism.SCRAM_SHA_512, "secret", b"salt", 8192)
    assert salted not in (via_salted.stored_key, via_salted.server_key)


@pytest.mark.parametrize("mech", list(Mechanism))
def test_round_trip(mech: Mechanism) -> None:
    creds = {"alice": credential(mech, "wonderland", iterations=4096)}
    server = _server(mech, creds)
    client = ScramClient(mech, "alice", "wonderland")
    final = client.final(server.step(client.first()))
    client.check(server.step(final))
    assert server.user == "alice"


def test_round_trip_name_with_comma_and_equals() -> None:
    mech = Mechanism.SCRAM_SHA_512
    creds = {"a,b=c": credential(mech, "pw")}
    server = _server(mech, creds)
    client = ScramClient(mech, "a,b=c", "pw")
    client.check(server.step(client.final(server.step(client.first()))))
    assert server.user == "a,b=c"


def test_wrong_password_fails() -> None:
    mech = Mechanism.SCRAM_SHA_256
    server = _server(mech, {"alice": credential(mech, "right")})
    client = ScramClient(mech, "alice", "wrong")
    final = client.final(server.step(client.first()))
    with pytest.raises(ScramError, match="invalid-proof"):
        server.step(final)
    assert server.user is None and not server.done


def test_unknown_user_looks_like_a_known_one() -> None:
    mech = Mechanism.SCRAM_SHA_256
    creds = {"alice": credential(mech, "right", iterations=4096)}
    first = _server(mech, creds).step(ScramClient(mech, "mallory", "x", nonce="n1").first())
    again = _server(mech, creds).step(ScramClient(mech, "mallory", "x", nonce="n1").first())
    known = _server(mech, creds).step(ScramClient(mech, "alice", "x", nonce="n1").first())
    # the same fake salt each time for one name, the same shape as a real user's
    assert first.split(b",")[1:] == again.split(b",")[1:]
    assert len(first.split(b",")[1]) == len(known.split(b",")[1])
    assert first.split(b",")[2] == known.split(b",")[2] == b"i=4096"
    server = _server(mech, creds)
    client = ScramClient(mech, "mallory", "x")
    with pytest.raises(ScramError, match="invalid-proof"):
        server.step(client.final(server.step(client.first())))


def test_channel_binding_refused() -> None:
    server = _server(Mechanism.SCRAM_SHA_256, {})
    with pytest.raises(ScramError, match="channel-binding"):
        server.step(b"p=tls-unique,,n=user,r=abc")


def test_binding_data_must_be_biws_and_nonce_must_match() -> None:
    mech = Mechanism.SCRAM_SHA_256
    creds = {"alice": credential(mech, "pw")}
    server = _server(mech, creds)
    client = ScramClient(mech, "alice", "pw")
    final = client.final(server.step(client.first()))
    with pytest.raises(ScramError, match="channel-bindings-dont-match"):
        server.step(final.replace(b"c=biws", b"c=eSws"))
    server = _server(mech, creds)
    server.step(client.first())
    with pytest.raises(ScramError, match="invalid-proof"):
        server.step(final)  # the previous exchange's nonce


def test_no_step_after_the_end() -> None:
    mech = Mechanism.SCRAM_SHA_256
    server = _server(mech, {"alice": credential(mech, "pw")})
    client = ScramClient(mech, "alice", "pw")
    server.step(client.final(server.step(client.first())))
    with pytest.raises(ScramError):
        server.step(b"n,,n=alice,r=x")


def test_old_librdkafkas_repeated_client_nonce_is_accepted_as_kafka_3_does() -> None:
    """librdkafka before 2.6.1 (Debian's kcat) sends ``r=<client nonce><combined
    nonce>`` in client-final; Kafka 3.x accepts a nonce that ends with the combined
    one (its proof signs the message as sent). One that does not end so is refused."""
    import hashlib
    import hmac as hmac_

    mech = Mechanism.SCRAM_SHA_256
    creds = {"sam": credential(mech, "pw")}

    def final(client: ScramClient, server_first: bytes, nonce: str) -> bytes:
        """client-final with ``nonce``, its proof right for the message as sent."""
        attrs = dict(kv.split("=", 1) for kv in server_first.decode().split(","))
        salted = salted_password(mech, "pw", base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac_.new(salted, b"Client Key", hashlib.sha256).digest()
        without_proof = f"c=biws,r={nonce}"
        auth = ",".join((f"n=sam,r={client.nonce}", server_first.decode(),
                         without_proof)).encode()
        sig = hmac_.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def combined(server_first: bytes) -> str:
        return dict(kv.split("=", 1) for kv in server_first.decode().split(","))["r"]

    client = ScramClient(mech, "sam", "pw")
    server = _server(mech, creds)
    first = server.step(client.first())
    assert server.step(final(client, first, client.nonce + combined(first))).startswith(b"v=")
    assert server.user == "sam"
    server = _server(mech, creds)
    first = server.step(client.first())
    with pytest.raises(ScramError, match="invalid-proof"):  # the server's nonce cut short
        server.step(final(client, first, client.nonce + combined(first)[:-1]))
