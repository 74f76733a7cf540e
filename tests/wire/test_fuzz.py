"""Random and mutated frames, whole or one byte at a time: only WireError, never anything else.

The seed comes from hypothesis; a failure prints the falsifying example, and
``--hypothesis-seed=N`` replays it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.wire.connection import (
    NEED_DATA,
    ClientConnection,
    ConnectionEnded,
    RequestReceived,
    RequestRejected,
    ServerConnection,
)
from ledgerd.wire.errors import WireError
from ledgerd.wire.frames import encode_request, encode_response
from ledgerd.wire.messages import REQUEST_TYPES, RESPONSE_TYPES, ApiKey
from ledgerd.wire.status import Status
from tests.wire.strategies import message_strategy
from tests.wire.test_vectors import REQUESTS

valid_request_frames = st.sampled_from(list(ApiKey)).flatmap(
    lambda k: message_strategy(REQUEST_TYPES[k], max_items=3)).map(
    lambda m: encode_request(m, 1))


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "size"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            i = draw(st.integers(0, len(data) - 1))
            del data[i]
        elif op == "truncate" and data:
            del data[draw(st.integers(0, len(data) - 1)):]
        elif op == "size" and len(data) >= 4:
            data[0:4] = draw(st.integers(-(2**31), 2**31 - 1)).to_bytes(4, "big", signed=True)
    return bytes(data)


def _feed_server(data: bytes, chunk: int) -> None:
    server = ServerConnection(max_frame_bytes=4096, max_inflight=1 << 20)
    try:
        for i in range(0, len(data), chunk):
            server.receive_data(data[i : i + chunk])
            while True:
                ev = server.next_event()
                if ev is NEED_DATA:
                    break
                assert isinstance(ev, (RequestReceived, RequestRejected, ConnectionEnded))
                if isinstance(ev, RequestRejected) and ev.close:
                    return
        server.receive_data(b"")
        while not isinstance(server.next_event(), ConnectionEnded):
            pass
    except WireError:
        pass


any_bytes = st.one_of(st.binary(max_size=300), mutated(valid_request_frames),
                      st.lists(mutated(valid_request_frames), max_size=4).map(b"".join))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=any_bytes, chunk=st.sampled_from([1, 3, 7, 64, 4096]))
def test_server_raises_only_wire_errors(data: bytes, chunk: int) -> None:
    _feed_server(data, chunk)


_SAMPLE_REQUESTS = {type(m).API_KEY: m for m in REQUESTS.values()}
valid_response_frames = st.sampled_from(list(ApiKey)).flatmap(
    lambda k: message_strategy(RESPONSE_TYPES[k], max_items=3)).map(
    lambda m: encode_response(0, Status.OK, m))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=200), mutated(valid_response_frames)),
       key=st.sampled_from(list(ApiKey)), chunk=st.sampled_from([1, 5, 4096]))
def test_client_raises_only_wire_errors(data: bytes, key: ApiKey, chunk: int) -> None:
    client = ClientConnection(max_frame_bytes=4096)
    # The pending request decides which response layout the bytes are decoded with.
    client.send(_SAMPLE_REQUESTS[key])
    try:
        for i in range(0, len(data), chunk):
            client.receive_data(data[i : i + chunk])
            while client.next_event() is not NEED_DATA:
                if client.closed:
                    return
    except WireError:
        pass
