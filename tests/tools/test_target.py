"""Which cluster a tool acts on (tools/target.py), how the shell shows payloads
(tools/payloads.py), and the replacement error that names a missing spare bookie: pure
decisions, no sockets."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from ledgerd.machines.placement import NotEnoughBookiesError, choose_replacements
from ledgerd.tools.payloads import json_fields, render
from ledgerd.tools.target import (
    Source,
    env_override_problem,
    find_local_clusters,
    resolve,
    unnamed_write_problem,
)

LOCAL = (Path("/tmp/ledgerd-local-a"), "127.0.0.1:4000", "/ledgers")


def test_a_named_cluster_wins_over_a_running_local_one() -> None:
    assert resolve(flag="zk:1", env="zk:2", local=[LOCAL]).source is Source.FLAG
    t = resolve(flag=None, env="zk:2", local=[LOCAL])
    assert (t.zk, t.source, t.is_named) == ("zk:2", Source.ENV, True)
    t = resolve(flag=None, env=None, local=[LOCAL])
    assert (t.zk, t.source, t.root, t.is_named) == ("127.0.0.1:4000", Source.LOCAL,
                                                    "/ledgers", False)
    assert "ledgerd-local-a" in t.describe()
    t = resolve(flag=None, env=None, local=[])
    assert (t.zk, t.source, t.is_named) == ("127.0.0.1:2181", Source.DEFAULT, False)
    with pytest.raises(ValueError, match="several `ledgerd local` clusters run"):
        resolve(flag=None, env=None, local=[LOCAL, (Path("/tmp/b"), "127.0.0.1:5", "/l")])


def test_cluster_metadata_is_written_only_where_the_user_named_it() -> None:
    assert unnamed_write_problem(resolve(flag="zk:1", env=None, local=[]), "metaformat") == ""
    assert unnamed_write_problem(resolve(flag=None, env="zk:2", local=[]), "metaformat") == ""
    found = unnamed_write_problem(resolve(flag=None, env=None, local=[LOCAL]),
                                  "initnewcluster")
    assert found.startswith("initnewcluster writes cluster metadata and names no cluster")
    assert "--zk 127.0.0.1:4000" in found
    default = unnamed_write_problem(resolve(flag=None, env=None, local=[]), "cookie update")
    assert "127.0.0.1:2181 is only the default" in default


def test_a_new_bookie_does_not_follow_the_environment_into_another_cluster() -> None:
    problem = env_override_problem(file_zk="127.0.0.1:1", env_zk="127.0.0.1:2",
                                   has_cookie=False, conf="b.toml")
    assert problem.startswith("LEDGERD_ZK_SERVERS=127.0.0.1:2 overrides zk_servers = "
                              "'127.0.0.1:1' of b.toml")
    # An existing bookie is held by its cookie; the same value, or none in the file, or
    # no variable: nothing to refuse.
    assert env_override_problem(file_zk="a:1", env_zk="b:2", has_cookie=True, conf="f") == ""
    assert env_override_problem(file_zk="a:1", env_zk="a:1", has_cookie=False, conf="f") == ""
    assert env_override_problem(file_zk="", env_zk="b:2", has_cookie=False, conf="f") == ""
    assert env_override_problem(file_zk="a:1", env_zk=None, has_cookie=False, conf="f") == ""


def test_find_local_clusters_by_their_control_socket(tmp_path: Path) -> None:
    (tmp_path / "ledgerd-local-x").mkdir()
    (tmp_path / "ledgerd-local-x" / "ctl.sock").touch()
    (tmp_path / "ledgerd-local-stopped").mkdir()  # no socket: not running
    assert find_local_clusters(tmp_path) == [tmp_path / "ledgerd-local-x"]
    # One another user planted (owned by nobody): not this user's cluster.
    planted = tmp_path / "ledgerd-local-planted"
    planted.mkdir()
    (planted / "ctl.sock").touch()
    os.chown(planted, 65534, 65534)
    assert find_local_clusters(tmp_path) == [tmp_path / "ledgerd-local-x"]


def test_payloads_never_reach_a_terminal_raw_and_json_is_lossless() -> None:
    raw = b"red \x1b[31mX\x00\xff\nend\t\xc3\xa9"
    text = render(raw)
    assert text == "red \\x1b[31mX\\x00\\xff\\nend\\t\u00e9"
    assert text.isprintable()
    assert render(raw, "hex") == raw.hex()
    assert base64.b64decode(render(raw, "base64")) == raw
    row = json_fields(raw)
    assert base64.b64decode(row["payload_base64"]) == raw and row["payload"] == text
    assert render(b"\xe2\x80\xae", "text") == "\\u202e"  # a right-to-left override
    with pytest.raises(ValueError, match="one of text, hex, base64"):
        render(b"", "raw")


def test_no_spare_bookie_is_named_as_the_reason() -> None:
    import random

    with pytest.raises(NotEnoughBookiesError) as info:
        choose_replacements({"a:1", "c:1"}, ("a:1", "b:1", "c:1"), {1}, random.Random(1))
    assert str(info.value).startswith("no writable bookie outside the ensemble to copy to")
    assert "add a bookie, or bring the lost one back" in str(info.value)
    assert info.value.excluded == 2


async def test_a_client_with_no_zookeeper_named_fails_at_once_saying_how() -> None:
    import trio

    from ledgerd.client import _check_default_zookeeper
    from ledgerd.metadata.errors import MetadataUnavailableError
    from ledgerd.tools.zkserver import find_free_port

    began = trio.current_time()
    with pytest.raises(MetadataUnavailableError) as info:
        await _check_default_zookeeper(f"127.0.0.1:{find_free_port()}")
    assert trio.current_time() - began < 3
    assert "no ZooKeeper was named: pass open_client(zk_servers) or export " \
           "LEDGERD_ZK_SERVERS" in str(info.value)


def test_a_spark_failure_is_one_line_with_its_cause() -> None:
    from ledgerd.tools.audit import spark_error_line

    text = """An error occurred while calling o45.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0
failed 1 times, most recent failure: Lost task 0.0 (TID 1) (127.0.0.1 executor driver):
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/pyspark/worker.py", line 1247, in main
    process()
  File "/x/ledgerd/tools/audit.py", line 160, in check_on_worker
    client = client_for(client_options)
ledgerd.metadata.errors.MetadataUnavailableError: metadata service unavailable (tried 127.0.0.1:1): no session within 5s

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
\tat java.base/java.lang.Thread.run(Thread.java:840)
"""
    assert spark_error_line(text) == (
        "ledgerd.metadata.errors.MetadataUnavailableError: metadata service unavailable "
        "(tried 127.0.0.1:1): no session within 5s")
    assert spark_error_line("something odd\nmore") == "something odd"
