"""The gateway under faults and hostile input: kill -9 of the gateway (and of a bookie)
during an acks=all produce loop loses and duplicates nothing acknowledged; malformed,
oversized and unsupported requests get Kafka's error or a closed connection, and the
gateway goes on serving."""

from __future__ import annotations

import signal
import socket
import struct
import time
from pathlib import Path

from ledgerd.kafka.api import REQUESTS, RESPONSES, ApiKey, ErrorCode
from ledgerd.kafka.schema import Reader, decode, encode
from tests.kafka.conftest import GatewayProcess, KafkaCluster
from tests.kafka.crash_kit import wait_until
from tests.kafka.producer_proc import produce_through_faults, read_exactly_once


def test_kill9_of_the_gateway_and_a_bookie_during_acks_all_produce(
        kafka_cluster: KafkaCluster) -> None:
    def faults(n: int) -> None:
        if n == 300:
            kafka_cluster.gateway.stop(signal.SIGKILL)  # acks in flight are lost
            victim = next(b for b in kafka_cluster.bookies if b.running)
            victim.kill9()  # and a bookie of the (E3 of 4) ensembles with it
            kafka_cluster.gateway.start()

    acked = produce_through_faults(kafka_cluster.bootstrap, "crash-topic", 1500, faults)
    assert len(acked) > 300  # it went on after the crash
    got = read_exactly_once(kafka_cluster.bootstrap, "crash-topic", 1, acked)
    assert got == sorted(got)  # one producer, one partition: retries kept the order


def _request(api: ApiKey, version: int, body: dict[str, object], cid: int = 7) -> bytes:
    header = struct.pack(">hhih", api, version, cid, 4) + b"test"
    if REQUESTS[api].is_flexible(version):
        header += b"\x00"
    payload = header + b"".join(encode(REQUESTS[api], version, body))
    return struct.pack(">i", len(payload)) + payload


def _reply(sock: socket.socket, api: ApiKey, version: int) -> dict[str, object]:
    size = struct.unpack(">i", _recv(sock, 4))[0]
    data = _recv(sock, size)
    # after the correlation id (and a flexible response header's tags, but ApiVersions')
    flexible = RESPONSES[api].is_flexible(version) and api is not ApiKey.API_VERSIONS
    r = Reader(data, 5 if flexible else 4)
    return decode(RESPONSES[api], version, r)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _connect(cluster: KafkaCluster) -> socket.socket:
    host, port = cluster.bootstrap.split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _produce(topic: str, records: bytes) -> dict[str, object]:
    return {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": 0, "records": records}]}]}


def test_bad_requests_get_kafka_errors_and_the_gateway_goes_on(
        kafka_cluster: KafkaCluster) -> None:
    from tests.kafka.test_protocol import _batch

    with _connect(kafka_cluster) as sock:
        # ApiVersions above ours: error 35 in a v0 body listing what we support
        sock.sendall(_request(ApiKey.API_VERSIONS, 9, {}))
        reply = _reply(sock, ApiKey.API_VERSIONS, 0)
        assert reply["error_code"] == ErrorCode.UNSUPPORTED_VERSION and reply["api_keys"]
        # a batch with a bad CRC, an unknown topic, a RecordBatch in a v2 produce (which
        # carries message sets of magic 0/1): per-partition errors
        sock.sendall(_request(ApiKey.METADATA, 4, {"topics": [{"name": "bad-in"}],
                                                   "allow_auto_topic_creation": True}))
        _reply(sock, ApiKey.METADATA, 4)
        good = _batch()
        bad = good[:-1] + bytes([good[-1] ^ 0xFF])
        for topic, records, version, code in (
                ("bad-in", bad, 7, ErrorCode.CORRUPT_MESSAGE),
                ("no-such-topic", good, 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                ("bad-in", good, 2, ErrorCode.INVALID_RECORD),
                ("bad-in", good, 7, ErrorCode.NONE)):
            sock.sendall(_request(ApiKey.PRODUCE, version, _produce(topic, records)))
            reply = _reply(sock, ApiKey.PRODUCE, version)
            part = reply["responses"][0]["partition_responses"][0]  # type: ignore[index]
            assert part["error_code"] == code, (topic, version, part)
        base = part["base_offset"]
        # acks=0: no response (the acks=-1 produce after it gets the next reply, 3
        # records further on), and a partition error closes the connection: Kafka's
        # rule, the producer learns of it as a disconnect.
        sock.sendall(_request(ApiKey.PRODUCE, 7, {**_produce("bad-in", good), "acks": 0}))
        sock.sendall(_request(ApiKey.PRODUCE, 7, _produce("bad-in", good)))
        reply = _reply(sock, ApiKey.PRODUCE, 7)
        assert reply["responses"][0]["partition_responses"][0]["base_offset"] == base + 6  # type: ignore[index]
        sock.sendall(_request(ApiKey.PRODUCE, 7, {**_produce("no-such-topic", good), "acks": 0}))
        assert _closed(sock)
    with _connect(kafka_cluster) as sock:  # the same at acks=0: a close
        sock.sendall(_request(ApiKey.PRODUCE, 2, {**_produce("bad-in", good), "acks": 0}))
        assert _closed(sock)
    hostile = [
        struct.pack(">i", 1 << 30),  # a frame over max_request_bytes
        struct.pack(">ihhih", 10 + 8, 1, 3, 1, 0) + bytes(8),  # Fetch v3: below what we serve
        struct.pack(">ihhih", 14, 3, 1, 1, 0) + struct.pack(">i", 5),  # Metadata: 5 topics, no bytes
        struct.pack(">ihhih", 10, 999, 0, 1, 0),  # an API key nobody has
    ]
    for frame in hostile:
        with _connect(kafka_cluster) as sock:
            sock.sendall(frame)
            assert _closed(sock), frame
    with _connect(kafka_cluster) as sock:  # and the gateway still answers
        sock.sendall(_request(ApiKey.API_VERSIONS, 2, {}))
        assert _reply(sock, ApiKey.API_VERSIONS, 2)["error_code"] == 0


def _metric(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in {url}")


def _answers_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except TimeoutError:
        return False
    finally:
        sock.settimeout(30)


def test_requests_held_over_all_connections_are_bounded(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    # A gateway whose request budget (max_queued_request_bytes) holds one of its
    # largest requests and not two: a connection that announced one and sends it
    # slowly holds its bytes; a second one waits for room before it reads its own, and
    # a request after it waits in turn (first come, first served); when the first
    # connection goes, its bytes come back and both go on. Nothing is refused.
    gw = GatewayProcess(kafka_cluster.zk, tmp_path / "gw.log", env={
        "LEDGERD_MAX_REQUEST_BYTES": "600000",
        "LEDGERD_MAX_QUEUED_REQUEST_BYTES": str(1 << 20)})
    gw.start()
    host, port = gw.bootstrap.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as slow:
            slow.sendall(struct.pack(">i", 600000) + b"\x00" * 1000)  # and no more yet
            with socket.create_connection((host, int(port)), timeout=30) as small:
                small.sendall(_request(ApiKey.API_VERSIONS, 2, {}))  # fits beside it
                assert _reply(small, ApiKey.API_VERSIONS, 2)["error_code"] == 0
            big = socket.create_connection((host, int(port)), timeout=30)
            big.sendall(struct.pack(">i", 600000))  # does not fit: waits
            behind = socket.create_connection((host, int(port)), timeout=30)
            behind.sendall(_request(ApiKey.API_VERSIONS, 2, {}))
            assert not _answers_within(behind, 1.0)
            assert _metric(gw.metrics_url, "ledgerd_kafka_request_budget_waits_total") == 2
            assert _metric(gw.metrics_url, "ledgerd_kafka_request_bytes_held") == 600004
        # the slow connection closed: its bytes back, the waiting ones go on
        assert _reply(behind, ApiKey.API_VERSIONS, 2)["error_code"] == 0
        big.close()
        behind.close()
        wait_until(lambda: _metric(gw.metrics_url, "ledgerd_kafka_request_bytes_held") == 0,
                   "the request bytes given back")
    finally:
        gw.stop()  # a SIGKILL left its registration for the next test's cluster view


def test_a_request_announced_and_not_sent_gives_its_budget_back_in_time(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """An outside probe locked a gateway up with 33 connections that each sent a 16 MiB
    request's size and nothing more: the budget is taken on the size, and every other
    client waited for as long as they stayed. The rest of a request must now come
    within request_read_timeout_ms; past it the connection is closed and the bytes go
    back to the client waiting first."""
    gw = GatewayProcess(kafka_cluster.zk, tmp_path / "gw.log", env={
        "LEDGERD_MAX_REQUEST_BYTES": "600000",
        "LEDGERD_MAX_QUEUED_REQUEST_BYTES": str(1 << 20),
        "LEDGERD_REQUEST_READ_TIMEOUT_MS": "1500"})
    gw.start()
    host, port = gw.bootstrap.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as squat, \
                socket.create_connection((host, int(port)), timeout=30) as big:
            squat.sendall(struct.pack(">i", 600000) + b"\x00" * 10)  # and nothing more
            wait_until(lambda: _metric(gw.metrics_url,
                                       "ledgerd_kafka_request_bytes_held") == 600004,
                       "the announced request's bytes taken")
            big.sendall(_request(ApiKey.METADATA, 4, {  # fits beside the squatter's bytes
                "topics": None, "allow_auto_topic_creation": False}))
            # this one only once they are back
            big.sendall(_request(ApiKey.PRODUCE, 7, _produce("t", b"\x00" * 500000)))
            assert _reply(big, ApiKey.METADATA, 4)["brokers"]
            began = time.monotonic()
            assert _closed(squat) and time.monotonic() - began < 10  # the timeout's doing
            reply = _reply(big, ApiKey.PRODUCE, 7)  # read once the budget came back
            assert reply["responses"]
        assert "kafka_request_read_timeout" in (tmp_path / "gw.log").read_text()
        assert _metric(gw.metrics_url, "ledgerd_kafka_connections_closed_bad_total") >= 1
    finally:
        gw.stop()  # a SIGKILL left its registration for the next test's cluster view


def _fetch(topic: str, max_bytes: int, max_wait_ms: int = 0) -> dict[str, object]:
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1,
            "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def _hog(host: str, port: int, topic: str, fetches: int = 16) -> socket.socket:
    """A connection that sends ``fetches`` Fetches at once and never reads a reply
    (each ready to wait 30 s for room)."""
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect((host, port))
    hog.sendall(b"".join(_request(ApiKey.FETCH, 12, _fetch(topic, 50 << 20, 30000), cid)
                         for cid in range(fetches)))
    return hog


def _fill(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for _ in range(80):
        producer.produce(topic, b"\x00" * (64 << 10))
    assert producer.flush(60) == 0  # 5 MiB in partition 0, in ledgers of 1 MiB


def test_fetch_responses_held_over_all_connections_are_bounded(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """An outside probe's finding: a client that sends Fetches and never reads their
    responses made the gateway hold up to max_inflight_requests responses of up to
    50 MB each, on every connection. Now what fetched records hold is bounded over
    every connection (max_held_response_bytes, 8 MiB here). 16 connections send 6
    fetches each and never read: the kernel takes a few replies of each (about
    3 MiB a connection), then one reply sticks and holds its room, and the next waits
    to take any until it is out. They fill the budget and stay within it (and the
    replies' headers); a well-behaved client's fetch, finding no room within its
    max_wait, is answered without records, and gets them once those connections are
    gone and their bytes came back."""
    limit = 8 << 20
    gw = GatewayProcess(kafka_cluster.zk, tmp_path / "gw.log", env={
        "LEDGERD_MAX_HELD_RESPONSE_BYTES": str(limit)})
    gw.start()
    host, port = gw.bootstrap.split(":")
    try:
        _fill(gw.bootstrap, "fat")
        hogs = [_hog(host, int(port), "fat", fetches=6) for _ in range(16)]
        wait_until(lambda: _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held")
                   > limit - (2 << 20), "the response budget spent")
        wait_until(lambda: _metric(gw.metrics_url,
                                   "ledgerd_kafka_response_budget_waits_total") >= 1,
                   "a fetch waiting for room")
        with socket.create_connection((host, int(port)), timeout=30) as good:
            good.sendall(_request(ApiKey.FETCH, 12, _fetch("fat", 1 << 20, 2000)))
            samples = 0
            while not _answers_within(good, 0.1):  # until its answer, while the hogs
                # hold the room: within the limit (and the replies' headers), each
                # reply's first batch within its room
                held = _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held")
                assert held <= limit + (64 << 10), held
                samples += 1
                assert samples < 300, "no answer within 30 s (its max_wait is 2 s)"
            assert samples >= 1  # the room was looked at while the fetch waited for it
            part = _reply(good, ApiKey.FETCH, 12)["responses"][0]["partitions"][0]  # type: ignore[index]
            assert (part["error_code"], part["high_watermark"], part["records"]) == (
                0, 80, b"")  # no room came within its max_wait: no records
            for hog in hogs:
                hog.close()
            good.sendall(_request(ApiKey.FETCH, 12, _fetch("fat", 1 << 20, 10000)))
            part = _reply(good, ApiKey.FETCH, 12)["responses"][0]["partitions"][0]  # type: ignore[index]
            assert part["error_code"] == 0 and len(part["records"]) >= 64 << 10
        wait_until(lambda: _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held") == 0,
                   "the response bytes given back")
    finally:
        gw.stop()  # a SIGKILL left its registration for the next test's cluster view


def test_a_connections_later_fetches_take_no_room_before_its_earlier_replies_are_out(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """A reviewer's finding: one connection could deadlock itself, and with it every
    fetch of the gateway. A long-polling fetch first, then fetches that filled the
    budget behind it with replies that are written only after the first one's (Kafka's
    replies go in request order); the first, woken by a record, then waited for room
    that could never come back. Now a fetch takes room only once the replies before
    it on its connection are out: while the first is parked, the others hold none,
    and every reply comes, in order."""
    from confluent_kafka import Producer

    gw = GatewayProcess(kafka_cluster.zk, tmp_path / "gw.log")
    gw.start()
    host, port = gw.bootstrap.split(":")
    try:
        _fill(gw.bootstrap, "room")
        producer = Producer({"bootstrap.servers": gw.bootstrap})
        producer.produce("room-wake", b"first")
        assert producer.flush(30) == 0  # the topic exists, one record at offset 0
        with socket.create_connection((host, int(port)), timeout=60) as sock:

            def high_watermark() -> int:  # as this gateway sees it (it may follow)
                sock.sendall(_request(ApiKey.FETCH, 12, _fetch("room-wake", 1 << 20)))
                reply = _reply(sock, ApiKey.FETCH, 12)
                return reply["responses"][0]["partitions"][0]["high_watermark"]  # type: ignore[index, no-any-return]

            wait_until(lambda: high_watermark() == 1, "the record seen by this gateway")
            parked = _fetch("room-wake", 1 << 20, 20000)
            parked["topics"][0]["partitions"][0]["fetch_offset"] = 1  # type: ignore[index]
            sock.sendall(_request(ApiKey.FETCH, 12, parked, 0)
                         + b"".join(_request(ApiKey.FETCH, 12, _fetch("room", 50 << 20), cid)
                                    for cid in range(1, 16)))
            assert not _answers_within(sock, 1.5)  # the first is parked
            # at most the floor the first takes while it looks again (as a follower,
            # it polls); the fifteen behind it none
            assert _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held") <= 1 << 20
            producer.produce("room-wake", b"wake")  # it wakes
            assert producer.flush(30) == 0
            got = [_reply(sock, ApiKey.FETCH, 12) for _ in range(16)]
        first = got[0]["responses"][0]["partitions"][0]  # type: ignore[index]
        assert first["error_code"] == 0 and first["high_watermark"] == 2
        assert all(r["responses"][0]["partitions"][0]["error_code"] == 0  # type: ignore[index]
                   and r["responses"][0]["partitions"][0]["records"] for r in got)
        wait_until(lambda: _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held") == 0,
                   "the response bytes given back")
    finally:
        gw.stop()  # a SIGKILL left its registration for the next test's cluster view


def test_a_client_that_does_not_read_its_responses_is_closed_in_time(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """A response not written within response_write_timeout_ms (plus a second a MiB)
    closes its connection, and what its responses held goes back, while the client
    still holds its end open and has read nothing."""
    gw = GatewayProcess(kafka_cluster.zk, tmp_path / "gw.log", env={
        "LEDGERD_RESPONSE_WRITE_TIMEOUT_MS": "500"})
    gw.start()
    host, port = gw.bootstrap.split(":")
    try:
        _fill(gw.bootstrap, "unread")
        with _hog(host, int(port), "unread"):
            wait_until(lambda: _metric(gw.metrics_url, "ledgerd_kafka_response_bytes_held")
                       > 0, "responses held")
            wait_until(lambda: "kafka_response_write_timeout" in
                       (tmp_path / "gw.log").read_text(), "the write timeout")
            wait_until(lambda: _metric(gw.metrics_url,
                                       "ledgerd_kafka_response_bytes_held") == 0,
                       "the response bytes given back")
            assert _metric(gw.metrics_url, "ledgerd_kafka_connections_closed_bad_total") == 1
    finally:
        gw.stop()  # a SIGKILL left its registration for the next test's cluster view


def test_topic_names_that_cannot_be_topics_are_refused_by_name(
        kafka_cluster: KafkaCluster) -> None:
    """"." and ".." (paths that name no node) and Kafka's internal topics are never
    made: Metadata answers INVALID_TOPIC_EXCEPTION, CreateTopics
    INVALID_TOPIC_EXCEPTION with the rule; the connection stays up (no failed request,
    as "." once made)."""
    with _connect(kafka_cluster) as sock:
        sock.sendall(_request(ApiKey.METADATA, 4, {
            "topics": [{"name": n} for n in (".", "..", "__consumer_offsets", "ok.name")],
            "allow_auto_topic_creation": True}))
        got = {t["name"]: t["error_code"]  # type: ignore[index]
               for t in _reply(sock, ApiKey.METADATA, 4)["topics"]}  # type: ignore[attr-defined]
        assert got == {".": ErrorCode.INVALID_TOPIC_EXCEPTION,
                       "..": ErrorCode.INVALID_TOPIC_EXCEPTION,
                       "__consumer_offsets": ErrorCode.INVALID_TOPIC_EXCEPTION,
                       "ok.name": ErrorCode.NONE}
        sock.sendall(_request(ApiKey.CREATE_TOPICS, 4, {"topics": [
            {"name": n, "num_partitions": 1, "replication_factor": -1, "assignments": [],
             "configs": []} for n in ("..", "__transaction_state")],
            "timeout_ms": 10000, "validate_only": False}))
        made = _reply(sock, ApiKey.CREATE_TOPICS, 4)["topics"]
        assert [(t["name"], t["error_code"]) for t in made] == [  # type: ignore[attr-defined]
            ("..", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("__transaction_state", ErrorCode.INVALID_TOPIC_EXCEPTION)]
        assert "'.' and '..'" in made[0]["error_message"]  # type: ignore[index]
        sock.sendall(_request(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [
            {"name": "..", "partition_indexes": [0]}]}))
        described = _reply(sock, ApiKey.DESCRIBE_PRODUCERS, 0)["topics"]
        assert described[0]["partitions"][0]["error_code"] \
            == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[index]
        sock.sendall(_request(ApiKey.API_VERSIONS, 2, {}))
        assert _reply(sock, ApiKey.API_VERSIONS, 2)["error_code"] == 0
    assert "kafka_request_failed" not in kafka_cluster.gateway.log_text()


def test_a_produce_to_an_internal_topic_fails_at_once(kafka_cluster: KafkaCluster) -> None:
    """A stock producer (librdkafka) to ``__consumer_offsets`` gets its delivery report
    with an error well within topic.metadata.propagation.max.ms (30 s), not after it;
    a Produce naming it directly is refused as Kafka refuses appends to internal
    topics."""
    import time

    from confluent_kafka import KafkaError, Producer

    reports: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap,
                         "message.timeout.ms": 120_000})
    started = time.monotonic()
    producer.produce("__consumer_offsets", b"x", on_delivery=lambda e, _m: reports.append(e))
    producer.flush(60)
    took = time.monotonic() - started
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() == KafkaError.TOPIC_EXCEPTION, reports[0]
    assert took < 20, took  # well before the 30 s propagation wait
    with _connect(kafka_cluster) as sock:
        sock.sendall(_request(ApiKey.PRODUCE, 8, {
            "transactional_id": None, "acks": -1, "timeout_ms": 5000, "topic_data": [
                {"name": "__consumer_offsets", "partition_data": [
                    {"index": 0, "records": b""}]}]}))
        part = _reply(sock, ApiKey.PRODUCE, 8)["responses"][0]["partition_responses"][0]
        assert part["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION  # type: ignore[index]


def test_a_port_in_use_is_named(kafka_cluster: KafkaCluster) -> None:
    import os
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "ledgerd.tools.cli", "gateway", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "LEDGERD_ZK_SERVERS": kafka_cluster.zk,
                 "LEDGERD_GATEWAY_HOST": "127.0.0.1", "LEDGERD_GATEWAY_ADMIN_PORT": "0"})
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port} (gateway_port): Address already in use" \
        in done.stderr, done.stderr[-2000:]
