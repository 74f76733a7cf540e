"""Sans-IO connections: pipelining, correlation, caps, negotiation, bad frames, EOF."""

from __future__ import annotations

import pytest

from ledgerd.wire.connection import (
    NEED_DATA,
    ClientConnection,
    ConnectionEnded,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    ServerConnection,
    api_versions_response,
)
from ledgerd.wire.errors import (
    ConnectionClosedError,
    FrameSizeError,
    FrameTooLargeError,
    LocalProtocolError,
    MessageTooLargeError,
    NoCommonVersionError,
    RemoteProtocolError,
    TooManyInflightError,
    UnexpectedResponseError,
)
from ledgerd.wire.frames import encode_request, encode_response
from ledgerd.wire.messages import (
    AddRequest,
    AddResponse,
    ApiKey,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ReadLacRequest,
    ReadRequest,
    ReadResponse,
)
from ledgerd.wire.status import Status


def _drain(conn: ServerConnection | ClientConnection) -> list[object]:
    events = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            return events
        events.append(ev)
        if isinstance(ev, ConnectionEnded) or (isinstance(ev, RequestRejected) and ev.close):
            return events


def test_pipelined_requests_fed_one_byte_at_a_time() -> None:
    client = ClientConnection()
    server = ServerConnection()
    reqs = [ReadRequest(ledger_id=1, entry_id=i) for i in range(5)]
    wire_bytes = b"".join(client.send(r) for r in reqs)
    events = []
    for i in range(len(wire_bytes)):
        server.receive_data(wire_bytes[i : i + 1])
        events.extend(_drain(server))
    assert [e.message for e in events] == reqs  # type: ignore[attr-defined]
    assert [e.correlation_id for e in events] == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]
    assert len(server.inflight) == 5


def test_responses_out_of_order_match_their_requests() -> None:
    client = ClientConnection()
    server = ServerConnection()
    a = ReadRequest(ledger_id=1, entry_id=0)
    b = ReadLacRequest(ledger_id=2)
    server.receive_data(client.send(a) + client.send(b))
    ev_a, ev_b = _drain(server)
    assert isinstance(ev_a, RequestReceived) and isinstance(ev_b, RequestReceived)
    out = server.send(ev_b.correlation_id, Status.NO_SUCH_LEDGER)
    out += server.send(ev_a.correlation_id, Status.OK,
                       ReadResponse(ledger_id=1, entry_id=0, max_lac=-1, entry=b"x"))
    assert not server.inflight
    client.receive_data(out)
    first, second = _drain(client)
    assert isinstance(first, ResponseReceived) and first.request == b
    assert first.status == Status.NO_SUCH_LEDGER and first.response is None
    assert isinstance(second, ResponseReceived) and second.request == a
    assert second.response == ReadResponse(ledger_id=1, entry_id=0, max_lac=-1, entry=b"x")


def test_client_inflight_cap() -> None:
    client = ClientConnection(max_inflight=2)
    client.send(ReadLacRequest(ledger_id=1))
    client.send(ReadLacRequest(ledger_id=1))
    assert not client.can_send
    with pytest.raises(TooManyInflightError):
        client.send(ReadLacRequest(ledger_id=1))


def test_server_capacity_flag() -> None:
    client = ClientConnection()
    server = ServerConnection(max_inflight=2)
    server.receive_data(b"".join(client.send(ReadLacRequest(ledger_id=i)) for i in range(2)))
    events = _drain(server)
    assert server.is_at_capacity
    server.send(events[0].correlation_id, Status.OK, None)  # type: ignore[attr-defined]
    assert not server.is_at_capacity


def test_unknown_api_key_gets_unsupported_version_and_connection_continues() -> None:
    server = ServerConnection()
    bad = (8).to_bytes(4, "big") + (99).to_bytes(2, "big") + (0).to_bytes(2, "big") + \
        (5).to_bytes(4, "big")
    good = encode_request(ReadLacRequest(ledger_id=3), 6)
    server.receive_data(bad + good)
    rejected, received = _drain(server)
    assert rejected == RequestRejected(5, Status.UNSUPPORTED_VERSION, "unknown api key 99",
                                       close=False)
    assert isinstance(received, RequestReceived) and received.correlation_id == 6


def test_unknown_version_gets_unsupported_version() -> None:
    server = ServerConnection()
    server.receive_data(encode_request(ReadLacRequest(ledger_id=3), 8, api_version=7))
    (ev,) = _drain(server)
    assert isinstance(ev, RequestRejected)
    assert ev.status == Status.UNSUPPORTED_VERSION and not ev.close


def test_oversized_frame_gets_bad_request_and_closes() -> None:
    server = ServerConnection(max_frame_bytes=1024)
    req = AddRequest(ledger_id=1, first_entry_id=0, master_key=bytes(20), entries=(b"x" * 2000,))
    server.receive_data(encode_request(req, 11)[:20])  # only the header has arrived
    (ev,) = _drain(server)
    assert isinstance(ev, RequestRejected)
    assert ev.correlation_id == 11 and ev.status == Status.BAD_REQUEST and ev.close
    assert "max_frame_bytes=1024" in ev.reason
    with pytest.raises(ConnectionClosedError):
        server.receive_data(b"more")


def test_malformed_body_gets_bad_request_and_closes() -> None:
    server = ServerConnection()
    frame = bytearray(encode_request(ReadLacRequest(ledger_id=3), 12))
    frame += b"junk"
    frame[0:4] = (len(frame) - 4).to_bytes(4, "big")
    server.receive_data(bytes(frame))
    (ev,) = _drain(server)
    assert isinstance(ev, RequestRejected) and ev.status == Status.BAD_REQUEST and ev.close


@pytest.mark.parametrize("size", [-1, 0, 7])
def test_impossible_size_raises_frame_size_error(size: int) -> None:
    server = ServerConnection()
    server.receive_data(size.to_bytes(4, "big", signed=True) + bytes(8))
    with pytest.raises(FrameSizeError):
        server.next_event()
    assert server.closed


def test_eof_mid_frame_reports_partial_and_pending() -> None:
    client = ClientConnection()
    server = ServerConnection()
    data = client.send(ReadLacRequest(ledger_id=1))
    server.receive_data(data[:5])
    server.receive_data(b"")
    (ev,) = _drain(server)
    assert ev == ConnectionEnded(partial_frame=True)
    client.receive_data(b"")
    (cev,) = _drain(client)
    assert isinstance(cev, ConnectionEnded) and cev.pending == ((0, ReadLacRequest(ledger_id=1)),)


def test_response_for_unknown_correlation_id_closes_client() -> None:
    client = ClientConnection()
    client.receive_data(encode_response(77, Status.OK, AddResponse(ledger_id=1, first_entry_id=0,
                                                                    count=1)))
    with pytest.raises(UnexpectedResponseError):
        client.next_event()
    assert client.closed


def test_oversized_response_is_refused() -> None:
    client = ClientConnection(max_frame_bytes=64)
    client.send(ReadLacRequest(ledger_id=1))
    client.receive_data((1000).to_bytes(4, "big") + bytes(10))
    with pytest.raises(FrameTooLargeError) as got:
        client.next_event()
    assert isinstance(got.value, RemoteProtocolError)  # the bookie's fault


def test_oversized_request_is_our_fault_and_leaves_the_connection_usable() -> None:
    client = ClientConnection(max_frame_bytes=1024)
    with pytest.raises(MessageTooLargeError) as got:
        client.send(AddRequest(ledger_id=1, first_entry_id=0, master_key=b"k" * 20,
                               entries=(bytes(2048),)))
    assert isinstance(got.value, LocalProtocolError)
    assert "1024" in str(got.value) and not client.closed
    client.send(ReadLacRequest(ledger_id=1))  # the next request goes out as usual


def test_api_versions_negotiation() -> None:
    client = ClientConnection()
    server = ServerConnection()
    server.receive_data(client.send(ApiVersionsRequest()))
    (ev,) = _drain(server)
    client.receive_data(server.send(ev.correlation_id, Status.OK,  # type: ignore[attr-defined]
                                    api_versions_response()))
    (resp,) = _drain(client)
    assert isinstance(resp, ResponseReceived)
    assert client.peer_versions is not None and client.peer_versions[ApiKey.ADD] == (0, 1)
    assert client.version_for(ApiKey.READ) == 0
    assert client.version_for(ApiKey.ADD) == 1  # SPARSE adds


def test_api_missing_on_peer_refuses_to_send() -> None:
    client = ClientConnection()
    client.send(ApiVersionsRequest())
    only_read = ApiVersionsResponse(versions=(ApiVersionRange(api_key=2, min_version=0,
                                                              max_version=0),))
    client.receive_data(encode_response(0, Status.OK, only_read))
    _drain(client)
    client.send(ReadRequest(ledger_id=1, entry_id=0))
    with pytest.raises(NoCommonVersionError) as got:
        client.send(ReadLacRequest(ledger_id=1))
    assert isinstance(got.value, LocalProtocolError)


def test_correlation_ids_wrap_at_int32() -> None:
    client = ClientConnection(next_correlation_id=2**31 - 1)
    client.send(ReadLacRequest(ledger_id=1))
    assert client.next_correlation_id == 0


def test_send_context_comes_back_with_its_response() -> None:
    client: ClientConnection[str] = ClientConnection()
    server = ServerConnection()
    server.receive_data(client.send(ReadLacRequest(ledger_id=1), "first")
                        + client.send(ReadLacRequest(ledger_id=2), "second"))
    ev_a, ev_b = _drain(server)
    client.receive_data(server.send(ev_b.correlation_id, Status.NO_SUCH_LEDGER)  # type: ignore[attr-defined]
                        + server.send(ev_a.correlation_id, Status.NO_SUCH_LEDGER))  # type: ignore[attr-defined]
    first, second = _drain(client)
    assert isinstance(first, ResponseReceived) and first.context == "second"
    assert isinstance(second, ResponseReceived) and second.context == "first"
    assert client.close() == []  # nothing left waiting


def test_close_hands_back_the_contexts_no_response_will_answer() -> None:
    client: ClientConnection[str] = ClientConnection()
    for name in ("a", "b", "c"):
        client.send(ReadLacRequest(ledger_id=1), name)
    # A response that cannot be decoded as its request's (ReadLac) layout: the bookie
    # broke the protocol, and the request it claimed to answer is failed with the rest.
    client.receive_data(encode_response(1, Status.OK, AddResponse(ledger_id=1,
                                                                   first_entry_id=0, count=1)))
    with pytest.raises(RemoteProtocolError):
        client.next_event()
    assert client.closed
    assert client.close() == ["a", "b", "c"]
    assert client.close() == []


def test_end_of_stream_leaves_the_contexts_for_close() -> None:
    client: ClientConnection[str] = ClientConnection()
    client.send(ReadLacRequest(ledger_id=1), "a")
    client.receive_data(b"")
    (ev,) = _drain(client)
    assert isinstance(ev, ConnectionEnded) and ev.pending == ((0, ReadLacRequest(ledger_id=1)),)
    assert client.close() == ["a"]
