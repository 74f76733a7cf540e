"""The derived fast codecs agree byte for byte with plain construct, for every message."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.wire.codec import build_plan, construct_decode, construct_encode, fast_codec
from ledgerd.wire.errors import MalformedBodyError, TruncatedFrameError, WireError
from ledgerd.wire.frames import (
    construct_decode_request,
    construct_encode_request,
    construct_encode_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from ledgerd.wire.messages import REQUEST_TYPES, RESPONSE_TYPES, AddRequest, ApiKey, Message
from ledgerd.wire.status import Status
from tests.wire.strategies import message_strategy

ALL_TYPES = [*REQUEST_TYPES.values(), *RESPONSE_TYPES.values()]


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fast_and_construct_agree(cls: type[Message], data: st.DataObject) -> None:
    msg = data.draw(message_strategy(cls))
    codec = fast_codec(cls)
    fast_bytes = codec.encode(msg)
    assert fast_bytes == construct_encode(msg)
    assert codec.decode(fast_bytes, 0, len(fast_bytes)) == msg
    assert construct_decode(cls, fast_bytes) == msg


@pytest.mark.parametrize("key", list(ApiKey), ids=lambda k: k.name)
@settings(max_examples=30, deadline=None)
@given(data=st.data(), cid=st.integers(0, 2**31 - 1))
def test_frames_round_trip(key: ApiKey, data: st.DataObject, cid: int) -> None:
    req = data.draw(message_strategy(REQUEST_TYPES[key]))
    frame = encode_request(req, cid)
    assert frame == construct_encode_request(req, cid)
    decoded = decode_request(frame[4:])
    assert decoded.message == req
    assert decoded.correlation_id == cid
    assert construct_decode_request(frame[4:]).message == req
    resp = data.draw(message_strategy(RESPONSE_TYPES[key]))
    status = data.draw(st.sampled_from(list(Status)))
    rframe = encode_response(cid, status, resp)
    assert rframe == construct_encode_response(cid, status, resp)
    back = decode_response(rframe[4:], key)
    # An error with an empty body decodes to no message (StartTls has an empty body).
    want = None if status != Status.OK and len(rframe) == 10 else resp
    assert (back.correlation_id, back.status, back.message) == (cid, status, want)


def test_error_response_may_have_empty_body() -> None:
    frame = encode_response(7, Status.NO_SUCH_LEDGER, None)
    back = decode_response(frame[4:], ApiKey.READ)
    assert back.message is None
    assert back.status == Status.NO_SUCH_LEDGER


def test_trailing_bytes_are_malformed_in_both_codecs() -> None:
    msg = AddRequest(ledger_id=1, first_entry_id=0, master_key=bytes(20), entries=(b"x",))
    body = fast_codec(AddRequest).encode(msg) + b"!"
    with pytest.raises(MalformedBodyError):
        fast_codec(AddRequest).decode(body, 0, len(body))
    with pytest.raises(MalformedBodyError):
        construct_decode(AddRequest, body)


def test_truncation_is_detected_in_both_codecs() -> None:
    msg = AddRequest(ledger_id=1, first_entry_id=0, master_key=bytes(20), entries=(b"xyz",))
    body = fast_codec(AddRequest).encode(msg)
    for cut in range(len(body)):
        short = body[:cut]
        with pytest.raises(WireError):
            fast_codec(AddRequest).decode(short, 0, len(short))
        with pytest.raises(WireError):
            construct_decode(AddRequest, short)


def test_entry_count_larger_than_bytes_is_rejected_before_allocating() -> None:
    msg = AddRequest(ledger_id=1, first_entry_id=0, master_key=bytes(20), entries=())
    body = bytearray(fast_codec(AddRequest).encode(msg))
    body[-4:] = (0xFFFFFFFF).to_bytes(4, "big")
    with pytest.raises(WireError, match="count"):
        fast_codec(AddRequest).decode(bytes(body), 0, len(body))


def test_blob_length_past_frame_is_truncated() -> None:
    msg = AddRequest(ledger_id=1, first_entry_id=0, master_key=bytes(20), entries=(b"ab",))
    body = bytearray(fast_codec(AddRequest).encode(msg))
    body[50:54] = (1000).to_bytes(4, "big")
    with pytest.raises(TruncatedFrameError):
        fast_codec(AddRequest).decode(bytes(body), 0, len(body))


def test_every_layout_compiles_to_a_plan() -> None:
    for cls in ALL_TYPES:
        plan = build_plan(cls.LAYOUT)
        assert plan.terminated, cls.__name__


def test_bad_values_refuse_to_encode() -> None:
    with pytest.raises(ValueError, match="master_key"):
        AddRequest(ledger_id=1, first_entry_id=0, master_key=b"short", entries=())
    too_big = AddRequest(ledger_id=1 << 70, first_entry_id=0, master_key=bytes(20), entries=())
    with pytest.raises(MalformedBodyError):
        encode_request(too_big, 1)


def test_fast_add_response_matches_the_codec() -> None:
    from ledgerd.wire.frames import encode_add_response, encode_response
    from ledgerd.wire.messages import AddResponse

    for cid, lid, first, count in ((0, 1, 0, 1), (2**31 - 1, 2**63 - 1, 2**40, 64), (7, 0, -1, 0)):
        msg = AddResponse(ledger_id=lid, first_entry_id=first, count=count)
        assert encode_add_response(cid, 0, lid, first, count) == encode_response(cid, 0, msg)
