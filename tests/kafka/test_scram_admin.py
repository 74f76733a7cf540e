"""DescribeUserScramCredentials and AlterUserScramCredentials decided without sockets
(``ledgerd/kafka/scram_admin.py``), the SCRAM record's JSON, and the store's bounds on
an in-memory metadata store."""

from __future__ import annotations

import pytest
import trio

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.scram import Mechanism, ScramClient, ScramServer, salted_password
from ledgerd.kafka.scram_admin import MAX_REQUEST_OPS, alter, describe
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.kafka_scram import ScramStore, _decode, _encode
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore

SHA256, SHA512 = int(Mechanism.SCRAM_SHA_256), int(Mechanism.SCRAM_SHA_512)


def _up(name: str, mech: int = SHA256, iterations: int = 4096,
        password: str = "pw", salt: bytes = b"salt") -> dict[str, object]:
    salted = (salted_password(Mechanism(mech), password, salt, iterations)
              if mech in (SHA256, SHA512) else b"x")
    return {"name": name, "mechanism": mech, "iterations": iterations, "salt": salt,
            "salted_password": salted}


def _alter(current, deletions=(), upsertions=()):  # type: ignore[no-untyped-def]
    return alter({"deletions": list(deletions), "upsertions": list(upsertions)}, current)


def _codes(results: list[dict[str, object]]) -> dict[object, object]:
    return {r["user"]: r["error_code"] for r in results}


def test_upsert_stores_keys_not_the_salted_password_and_authenticates() -> None:
    up = _up("alice", SHA512, 8192, "secret")
    creds, results = _alter({}, upsertions=[up])
    assert _codes(results) == {"alice": 0}
    cred = creds["alice"][SHA512]
    assert cred.iterations == 8192 and cred.salt == b"salt"
    assert up["salted_password"] not in (cred.stored_key, cred.server_key)
    server = ScramServer(Mechanism.SCRAM_SHA_512, lambda n: creds.get(n, {}).get(SHA512),
                         fake_secret=b"k")
    client = ScramClient(Mechanism.SCRAM_SHA_512, "alice", "secret")
    client.check(server.step(client.final(server.step(client.first()))))
    assert server.user == "alice"


def test_alter_refusals() -> None:
    current, _ = _alter({}, upsertions=[_up("bob")])
    creds, results = _alter(current, deletions=[
        {"name": "carol", "mechanism": SHA256},  # missing
        {"name": "bob", "mechanism": SHA512},  # bob has only 256
    ], upsertions=[
        _up("low", iterations=4095), _up("high", iterations=16385),
        _up("", SHA256), _up("odd", 3), _up("dup"), _up("dup"),
        _up("ok", SHA512, 16384)])
    assert _codes(results) == {
        "carol": ErrorCode.RESOURCE_NOT_FOUND, "bob": ErrorCode.RESOURCE_NOT_FOUND,
        "low": ErrorCode.UNACCEPTABLE_CREDENTIAL, "high": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL, "odd": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "dup": ErrorCode.DUPLICATE_RESOURCE, "ok": 0}
    assert all(r["error_message"] for r in results if r["error_code"])
    assert set(creds) == {"bob", "ok"} and set(creds["bob"]) == {SHA256}


def test_a_users_changes_apply_all_or_none() -> None:
    current, _ = _alter({}, upsertions=[_up("bob")])
    # delete bob's 256 and add a refused 512: neither happens
    creds, results = _alter(current, deletions=[{"name": "bob", "mechanism": SHA256}],
                            upsertions=[_up("bob", SHA512, iterations=100)])
    assert _codes(results) == {"bob": ErrorCode.UNACCEPTABLE_CREDENTIAL}
    assert creds is current
    # the same user and mechanism deleted and upserted: duplicate
    _, results = _alter(current, deletions=[{"name": "bob", "mechanism": SHA256}],
                        upsertions=[_up("bob", SHA256)])
    assert _codes(results) == {"bob": ErrorCode.DUPLICATE_RESOURCE}


def test_delete_last_mechanism_removes_the_user() -> None:
    current, _ = _alter({}, upsertions=[_up("bob"), _up("bob", SHA512)])
    creds, _ = _alter(current, deletions=[{"name": "bob", "mechanism": SHA256}])
    assert set(creds["bob"]) == {SHA512}
    creds, results = _alter(creds, deletions=[{"name": "bob", "mechanism": SHA512}])
    assert _codes(results) == {"bob": 0} and "bob" not in creds


def test_too_many_changes_in_one_request() -> None:
    ups = [_up(f"u{i}", salt=b"s", iterations=4096) for i in range(2)]
    ups = ups * (MAX_REQUEST_OPS // 2 + 1)
    creds, results = _alter({}, upsertions=ups)
    assert creds == {} and {r["error_code"] for r in results} == {
        ErrorCode.UNACCEPTABLE_CREDENTIAL}


def test_describe() -> None:
    creds, _ = _alter({}, upsertions=[_up("bob", SHA256, 4096), _up("bob", SHA512, 8192),
                                      _up("amy", SHA512, 5000)])
    everyone = describe({"users": None}, creds)
    assert describe({"users": []}, creds) == everyone
    assert [(r["user"], r["credential_infos"]) for r in everyone["results"]] == [
        ("amy", [{"mechanism": SHA512, "iterations": 5000}]),
        ("bob", [{"mechanism": SHA256, "iterations": 4096},
                 {"mechanism": SHA512, "iterations": 8192}])]
    asked = describe({"users": [{"name": "bob"}, {"name": "zed"}, {"name": "amy"},
                                {"name": "amy"}]}, creds)
    assert [(r["user"], r["error_code"]) for r in asked["results"]] == [
        ("bob", 0), ("zed", ErrorCode.RESOURCE_NOT_FOUND),
        ("amy", ErrorCode.DUPLICATE_RESOURCE)]
    assert "zed" in asked["results"][1]["error_message"]
    assert describe({"users": None}, {})["results"] == []


def test_record_round_trip() -> None:
    creds, _ = _alter({}, upsertions=[_up("a,b", SHA256), _up("c", SHA512, 9000)])
    raw = _encode(creds)
    assert b"salted" not in raw
    assert _decode(raw, "/x") == creds


def test_store_cas_and_user_cap() -> None:
    async def main() -> None:
        with trio.fail_after(10):
            store = ScramStore(InMemoryStore(InMemoryCluster()), "/ledgerd/kafka")
            assert await store.credentials() == {}
            await store.update(lambda c: _alter(c, upsertions=[_up("a")])[0])
            await store.update(lambda c: _alter(c, upsertions=[_up("b")])[0])
            assert set(await store.credentials()) == {"a", "b"}
            store.MAX_USERS = 2
            with pytest.raises(ChangeRejectedError):
                await store.update(lambda c: _alter(c, upsertions=[_up("c")])[0])
            assert set(await store.credentials()) == {"a", "b"}

    trio.run(main)


def test_gateway_sasl_mechanisms_misconfigured_is_refused() -> None:
    from ledgerd.base.settings import ConfigError
    from ledgerd.kafka.config import GatewayConfig

    assert GatewayConfig().scram_mechanisms() == ()
    both = GatewayConfig(gateway_sasl_mechanisms="PLAIN, scram-sha-512,SCRAM-SHA-256")
    assert both.scram_mechanisms() == ("SCRAM-SHA-512", "SCRAM-SHA-256")
    with pytest.raises(ConfigError, match="one or more of PLAIN"):
        GatewayConfig(gateway_sasl_mechanisms="SCRAM-SHA-1")
    with pytest.raises(ConfigError, match="one or more of"):
        GatewayConfig(gateway_sasl_mechanisms=" , ")
    with pytest.raises(ConfigError, match="PLAIN among them"):
        GatewayConfig(gateway_sasl_mechanisms="SCRAM-SHA-256",
                      gateway_principals_file="/etc/ledgerd/principals.toml")


def test_refusals_name_each_user() -> None:
    from ledgerd.kafka.api import ApiKey
    from ledgerd.kafka.refusals import refusal

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    described = refusal(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                        {"users": [{"name": "a"}, {"name": "b"}]}, code)
    assert described["error_code"] == code and described["error_message"]
    assert [(r["user"], r["error_code"], r["credential_infos"])
            for r in described["results"]] == [("a", code, []), ("b", code, [])]
    assert refusal(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": None},
                   code)["results"] == []
    altered = refusal(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, {
        "deletions": [{"name": "a", "mechanism": 1}],
        "upsertions": [_up("b"), _up("a", SHA512)]}, code)
    assert [(r["user"], r["error_code"]) for r in altered["results"]] == [
        ("a", code), ("b", code)]


def test_upsertion_alter_stored_and_refusal() -> None:
    """What both writers share (the gateway's AlterUserScramCredentials and ``ledgerd
    shell kafka scram``): an upsertion made from a password authenticates once stored;
    a change past the store's cap is refused per user, nothing written; the refusals
    that need no stored credentials."""
    from ledgerd.kafka.scram_admin import alter_stored, refusal, upsertion

    async def main() -> None:
        with trio.fail_after(10):
            store = ScramStore(InMemoryStore(InMemoryCluster()), "/ledgerd/kafka")
            up = upsertion("ann", Mechanism.SCRAM_SHA_256, "pw", 4096)
            assert len(up["salt"]) == 32 and up["salted_password"]
            results = await alter_stored(store, {"deletions": [], "upsertions": [up]})
            assert _codes(results) == {"ann": 0}
            creds = await store.credentials()
            server = ScramServer(Mechanism.SCRAM_SHA_256,
                                 lambda n: creds.get(n, {}).get(SHA256), fake_secret=b"k")
            client = ScramClient(Mechanism.SCRAM_SHA_256, "ann", "pw")
            client.check(server.step(client.final(server.step(client.first()))))
            store.MAX_USERS = 1
            results = await alter_stored(store, {"deletions": [], "upsertions": [
                upsertion("bo", Mechanism.SCRAM_SHA_512, "x", 4096)]})
            assert _codes(results) == {"bo": ErrorCode.UNACCEPTABLE_CREDENTIAL}
            assert "limit of 1" in results[0]["error_message"]
            assert set(await store.credentials()) == {"ann"}

    trio.run(main)
    assert refusal("ann", SHA256, 4096) is None and refusal("ann", SHA512) is None
    assert refusal("", SHA256) == (ErrorCode.UNACCEPTABLE_CREDENTIAL,
                                   "Username must not be empty")
    assert refusal("ann", 3)[0] == ErrorCode.UNSUPPORTED_SASL_MECHANISM  # type: ignore[index]
    assert refusal("ann", SHA256, 16385) == (
        ErrorCode.UNACCEPTABLE_CREDENTIAL, "Iterations 16385 not in the range 4096..16384")
    assert refusal("ann", SHA256, 4095) is not None
