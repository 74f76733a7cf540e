"""``ledgerd shell kafka scram`` and ``kafka acls``: the Kafka gateway's SCRAM credentials
and ACL bindings, in ZooKeeper (``acls`` at the end: list and delete, the way back in
when the ACLs lock everyone out of the ACL APIs).

The way in for a gateway that offers only SCRAM and has no super user yet (Kafka's
``kafka-storage format --add-scram``, formerly ``kafka-configs --zookeeper ... --alter
--add-config 'SCRAM-SHA-256=[password=...]'``): ``set`` creates or changes a user's
credential for one mechanism, ``delete`` removes one, ``list`` shows users, mechanisms
and iterations (never the keys). A change goes through what AlterUserScramCredentials
runs (``kafka/scram_admin.py``: the same refusals, StoredKey and ServerKey derived by
``kafka/scram.py``, one compare-and-set of ``<root>/kafka/scram``); a gateway checks
logins against the record as read within the last second, so it sees the change
without a restart.

The password is read from a prompt (twice, on a terminal), ``--password-file FILE``
or ``--password-stdin``; never from the command line, where other users' ``ps`` see it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ledgerd.tools.output import emit, table
from ledgerd.tools.shell import ShellError, _refuse_unnamed, _root, _run, _store, _zk, shell

__all__ = ["kafka_group", "register", "scram_group"]

_MECHANISMS = "SCRAM-SHA-256 or SCRAM-SHA-512"


def register() -> None:
    """The commands are declared on ``shell`` at import; this makes the import explicit."""


@shell.group("kafka")
def kafka_group() -> None:
    """The Kafka gateway's state in ZooKeeper."""


@kafka_group.group("scram")
def scram_group() -> None:
    """SCRAM credentials (SASL SCRAM-SHA-256/512) the Kafka gateways check logins against.

    Written straight to ZooKeeper (<root>/kafka/scram, by compare-and-set): how the first
    credential of a gateway offering only SCRAM is made. Gateways see a change within a
    second."""


def _mechanism(value: str) -> Any:
    from ledgerd.kafka.scram import Mechanism

    mech = Mechanism.from_sasl_name(value.strip().upper())
    if mech is None:
        raise ShellError(f"--mechanism {value!r}: not a SCRAM mechanism ({_MECHANISMS})")
    return mech


def _refuse(verb: str, user: str, mech: Any, iterations: int | None = None) -> None:
    """ShellError with AlterUserScramCredentials' reason when the change is refused
    whatever is stored (an empty name, iterations out of range)."""
    from ledgerd.kafka.scram_admin import refusal

    refused = refusal(user, int(mech), iterations)
    if refused is not None:
        raise ShellError(f"cannot {verb} the {mech.sasl_name} credential of user "
                         f"{user!r}: {refused[1]}")


def _one_line(text: str, where: str) -> str:
    """``text`` without its one trailing newline; ShellError if it holds another line
    or nothing."""
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    if "\n" in text or "\r" in text:
        raise ShellError(f"{where}: the password must be one line")
    if not text:
        raise ShellError(f"{where}: empty password")
    return text


def _password(user: str, mech: Any, password_file: Path | None, from_stdin: bool) -> str:
    if password_file is not None and from_stdin:
        raise ShellError("give one of --password-file, --password-stdin")
    if password_file is not None:
        try:
            text = password_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise ShellError(f"cannot read --password-file {password_file}: {why}") from None
        return _one_line(text, f"--password-file {password_file}")
    if from_stdin:
        return _one_line(sys.stdin.read(), "--password-stdin")
    if not sys.stdin.isatty():
        raise ShellError("no password: no terminal to prompt on; give --password-file FILE "
                         "or --password-stdin")
    text = click.prompt(f"{mech.sasl_name} password for {user}", hide_input=True,
                        confirmation_prompt=True, err=True)
    if not text:
        raise ShellError("empty password")
    return str(text)


def _failed(verb: str, user: str, mech: Any, results: list[dict[str, Any]]) -> None:
    for r in results:
        if r["error_code"]:
            raise ShellError(f"cannot {verb} the {mech.sasl_name} credential of user "
                             f"{user!r}: {r['error_message']}")


def _path(ctx: click.Context) -> str:
    from ledgerd.metadata.paths import kafka_root, kafka_scram_path

    return kafka_scram_path(kafka_root(_root(ctx)))


async def _alter(ctx: click.Context, body: dict[str, Any]) -> list[dict[str, Any]]:
    from ledgerd.kafka.scram_admin import alter_stored
    from ledgerd.metadata.kafka_scram import ScramStore
    from ledgerd.metadata.paths import kafka_root

    store = await _store(ctx)
    try:
        return await alter_stored(ScramStore(store, kafka_root(_root(ctx))), body)
    finally:
        await store.close()


@scram_group.command("set")
@click.argument("user")
@click.option("--mechanism", "mechanism", default="SCRAM-SHA-256", show_default=True,
              help=f"The SASL mechanism the credential is for: {_MECHANISMS}.")
@click.option("--iterations", type=int, default=4096, show_default=True,
              help="PBKDF2 iterations, 4096..16384 (Kafka's bounds).")
@click.option("--password-file", "password_file",
              type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read the password from this file (one line; a trailing newline "
                   "is dropped).")
@click.option("--password-stdin", "password_stdin", is_flag=True,
              help="Read the password from standard input (one line).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def set_cmd(ctx: click.Context, user: str, mechanism: str, iterations: int,
            password_file: Path | None, password_stdin: bool, as_json: bool) -> None:
    """Create or change USER's credential for one mechanism.

    The password is asked twice on a terminal; scripts give --password-file FILE or
    --password-stdin (there is no option taking it on the command line)."""
    from ledgerd.kafka.scram_admin import upsertion

    mech = _mechanism(mechanism)
    _refuse("set", user, mech, iterations)
    _refuse_unnamed(ctx, "kafka scram set")
    password = _password(user, mech, password_file, password_stdin)
    body = {"deletions": [], "upsertions": [upsertion(user, mech, password, iterations)]}
    _failed("set", user, mech, _run(_alter, ctx, body))
    doc = {"user": user, "mechanism": mech.sasl_name, "iterations": iterations,
           "path": _path(ctx)}
    emit(as_json, doc, f"set the {mech.sasl_name} credential of user {user!r} ({iterations} "
                       f"iterations) in {_zk(ctx)}{_path(ctx)}; gateways check it within a "
                       "second")


@scram_group.command("delete")
@click.argument("user")
@click.option("--mechanism", "mechanism", required=True,
              help=f"The mechanism whose credential goes: {_MECHANISMS}.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def delete_cmd(ctx: click.Context, user: str, mechanism: str, as_json: bool) -> None:
    """Delete USER's credential for one mechanism (its others stay). New logins with it
    fail within a second; connections already authenticated stay so."""
    mech = _mechanism(mechanism)
    _refuse("delete", user, mech)
    _refuse_unnamed(ctx, "kafka scram delete")
    body = {"deletions": [{"name": user, "mechanism": int(mech)}], "upsertions": []}
    _failed("delete", user, mech, _run(_alter, ctx, body))
    doc = {"user": user, "mechanism": mech.sasl_name, "path": _path(ctx)}
    emit(as_json, doc, f"deleted the {mech.sasl_name} credential of user {user!r} from "
                       f"{_zk(ctx)}{_path(ctx)}")


@scram_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """Every user with a SCRAM credential: mechanisms and iterations (never the keys)."""
    from ledgerd.kafka.scram import Mechanism
    from ledgerd.kafka.scram_admin import describe
    from ledgerd.metadata.kafka_scram import ScramStore
    from ledgerd.metadata.paths import kafka_root

    async def run() -> Any:
        store = await _store(ctx)
        try:
            return await ScramStore(store, kafka_root(_root(ctx))).credentials()
        finally:
            await store.close()

    def name(number: int) -> str:
        return Mechanism(number).sasl_name if number in {int(m) for m in Mechanism} else str(number)

    described = describe({"users": None}, _run(run))["results"]
    users = [{"user": r["user"],
              "credentials": [{"mechanism": name(i["mechanism"]), "iterations": i["iterations"]}
                              for i in r["credential_infos"]]} for r in described]
    rows = [[u["user"], c["mechanism"], c["iterations"]] for u in users
            for c in u["credentials"]]
    human = (table(["user", "mechanism", "iterations"], rows) if rows
             else f"no SCRAM credentials in {_zk(ctx)}{_path(ctx)}")
    emit(as_json, {"path": _path(ctx), "users": users}, human)


@kafka_group.group("acls")
def acls_group() -> None:
    """The Kafka gateway's ACL bindings, read and removed straight in ZooKeeper.

    The way back in for an operator whom the ACLs themselves lock out of the ACL APIs
    (a binding on the cluster resource closes its DESCRIBE and ALTER to every other
    principal, as on Kafka), as Kafka's kafka-acls.sh did with --authorizer-properties
    zookeeper.connect=...: `ledgerd kafka-acls` goes through a gateway and its
    authorizer; these do not. Gateways see a change within a second."""


def _acl_row(b: Any) -> dict[str, Any]:
    return {"resource_type": b.resource_type.name, "resource_name": b.resource_name,
            "pattern_type": b.pattern_type.name, "principal": b.principal, "host": b.host,
            "operation": b.operation.name, "permission": b.permission.name}


def _acl_store(store: Any, ctx: click.Context) -> Any:
    from ledgerd.metadata.kafka_acls import AclStore
    from ledgerd.metadata.paths import kafka_root

    return AclStore(store, kafka_root(_root(ctx)))


@acls_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def acls_list_cmd(ctx: click.Context, as_json: bool) -> None:
    """Every ACL binding, in the order they were created."""

    async def run() -> Any:
        store = await _store(ctx)
        try:
            return await _acl_store(store, ctx).bindings()
        finally:
            await store.close()

    rows = [_acl_row(b) for b in _run(run)]
    human = table(["resource", "name", "pattern", "principal", "host", "operation",
                   "permission"], [list(r.values()) for r in rows]) if rows \
        else f"no ACL bindings under {_zk(ctx)}{_root(ctx)}"
    emit(as_json, {"bindings": rows}, human)


@acls_group.command("delete")
@click.option("--all", "every", is_flag=True, help="Every binding.")
@click.option("--resource-type", "rtype", default=None,
              type=click.Choice(["topic", "group", "cluster", "transactional-id"],
                                case_sensitive=False))
@click.option("--resource-name", "rname", default=None)
@click.option("--principal", default=None, help="Type:name, e.g. User:alice")
@click.option("--force", is_flag=True, help="Without asking.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def acls_delete_cmd(ctx: click.Context, every: bool, rtype: str | None, rname: str | None,
                    principal: str | None, force: bool, as_json: bool) -> None:
    """Delete the bindings that match every filter given (--all: all of them)."""
    from ledgerd.metadata.kafka_acls import ResourceType

    if every == bool(rtype or rname or principal):
        raise ShellError("give --all, or at least one of --resource-type, --resource-name, "
                         "--principal (not both)")
    _refuse_unnamed(ctx, "kafka acls delete")
    wanted_type = None if rtype is None else ResourceType[rtype.upper().replace("-", "_")]

    def doomed(b: Any) -> bool:
        return ((wanted_type is None or b.resource_type is wanted_type)
                and (rname is None or b.resource_name == rname)
                and (principal is None or b.principal == principal))

    if not force:
        if not sys.stdin.isatty():
            raise ShellError("kafka acls delete asks first; give --force when stdin is "
                             "not a terminal")
        if not click.confirm("Delete the matching ACL bindings?"):
            return

    async def run() -> Any:
        store = await _store(ctx)
        try:
            return await _acl_store(store, ctx).remove(doomed)
        finally:
            await store.close()

    rows = [_acl_row(b) for b in _run(run)]
    emit(as_json, {"deleted": rows},
         f"deleted {len(rows)} ACL binding{'s' if len(rows) != 1 else ''}")
