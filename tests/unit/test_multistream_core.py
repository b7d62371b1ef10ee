"""multistream-select: message codec, dialer/listener over memory streams, the lazy 0-RTT form."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import NegotiationError, RemoteProtocolError
from volunteer.net.identify import IdentifyInfo, decode_identify, encode_identify
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.multistream import (
    PROTOCOL_ID,
    decode_message,
    encode_message,
    lazy_outbound,
    read_message,
    select_inbound,
    select_outbound,
)
from volunteer.net.streams import BufferedStream
from tests.recording import RecordingStream


def test_codec():
    assert encode_message("/multistream/1.0.0") == b"\x13/multistream/1.0.0\n"
    assert decode_message(encode_message("na") + b"rest") == ("na", 4)
    assert decode_message(b"\x05/ab") is None
    for bad in (b"\x03abc", b"\x02\xff\n", b"\x82\x10" + b"x" * 2050):
        with pytest.raises(RemoteProtocolError):
            decode_message(bad)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=50))
def test_decoder_random_bytes(data):
    try:
        decode_message(data)
    except RemoteProtocolError:
        pass


async def test_negotiation_with_fallback_and_refusal():
    left, right = trio.testing.memory_stream_pair()
    dialer, listener = BufferedStream(left), BufferedStream(right)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            result = {}

            async def listen():
                result["listener"] = await select_inbound(listener, {"/b/1"})

            nursery.start_soon(listen)
            assert await select_outbound(dialer, ["/a/1", "/b/1"]) == "/b/1"
        assert result["listener"] == "/b/1"
        # Data after negotiation is not lost.
        await dialer.send_all(b"payload")
        assert await listener.receive_some() == b"payload"

    left, right = trio.testing.memory_stream_pair()
    dialer, listener = BufferedStream(left), BufferedStream(right)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_listen_until_closed, listener, {"/z"})
            with pytest.raises(NegotiationError):
                await select_outbound(dialer, ["/a", "/b"])
            await dialer.aclose()


async def _listen_until_closed(stream, supported):
    try:
        await select_inbound(stream, supported)
    except RemoteProtocolError:
        pass



async def test_lazy_form_sends_header_protocol_and_data_in_one_write():
    left, right = trio.testing.memory_stream_pair()
    recording = RecordingStream(left)
    lazy = lazy_outbound(BufferedStream(recording), "/echo/1")
    listener = BufferedStream(right)
    with trio.fail_after(5):
        await lazy.send_all(b"first data")
        assert recording.writes == [encode_message(PROTOCOL_ID) + encode_message("/echo/1") + b"first data"]
        assert await select_inbound(listener, {"/echo/1"}) == "/echo/1"
        assert await listener.receive_exactly(10) == b"first data"
        await listener.send_all(b"reply")
        assert await lazy.receive_some() == b"reply"


async def test_lazy_form_refused():
    left, right = trio.testing.memory_stream_pair()
    lazy = lazy_outbound(BufferedStream(left), "/nope/1")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_listen_until_closed, BufferedStream(right), {"/echo/1"})
            await lazy.send_all(b"x")
            with pytest.raises(NegotiationError):
                await lazy.receive_some()
            await lazy.aclose()


async def test_garbage_from_peer():
    left, right = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        await left.send_all(b"\x05hello")  # no newline
        with pytest.raises(RemoteProtocolError):
            await select_inbound(BufferedStream(right), {"/a"})


def test_identify_roundtrip_and_tolerance():
    keypair = KeyPair.generate()
    info = IdentifyInfo(
        public_key=keypair.public_key,
        listen_addrs=[Multiaddr("/ip4/198.51.100.1/tcp/4001")],
        protocols=["/ipfs/ping/1.0.0"],
        observed_addr=Multiaddr("/ip4/203.0.113.5/tcp/5555"),
        agent_version="volunteer/test",
    )
    encoded = encode_identify(info)
    decoded = decode_identify(encoded)
    assert decoded.peer_id == keypair.peer_id and decoded.listen_addrs == info.listen_addrs
    assert decoded.observed_addr == info.observed_addr and decoded.protocols == info.protocols
    # Without the length prefix (older implementations) it still parses.
    from volunteer.net.varint import decode_uvarint

    _, start = decode_uvarint(encoded)
    assert decode_identify(encoded[start:]).agent_version == "volunteer/test"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_identify_random_bytes(data):
    try:
        decode_identify(data)
    except RemoteProtocolError:
        pass



async def test_listener_answers_header_and_echo_in_one_write_when_the_proposal_came_with_the_header():
    left, right = trio.testing.memory_stream_pair()
    counted = RecordingStream(right)
    await left.send_all(encode_message(PROTOCOL_ID) + encode_message("/b/1"))
    with trio.fail_after(5):
        assert await select_inbound(BufferedStream(counted), {"/b/1"}) == "/b/1"
    assert counted.writes == [encode_message(PROTOCOL_ID) + encode_message("/b/1")]


async def test_listener_sends_its_header_first_to_a_dialer_that_waits_for_it_before_proposing():
    """py-libp2p's dialer sends its header, waits for ours, then proposes: the listener must not
    hold its header back for the echo, or both wait for ever."""
    left, right = trio.testing.memory_stream_pair()
    dialer = BufferedStream(left)
    result = {}
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def listen():
                result["listener"] = await select_inbound(BufferedStream(right), {"/b/1"})

            nursery.start_soon(listen)
            await dialer.send_all(encode_message(PROTOCOL_ID))
            assert await read_message(dialer) == PROTOCOL_ID
            await dialer.send_all(encode_message("/a/1"))
            assert await read_message(dialer) == "na"
            await dialer.send_all(encode_message("/b/1"))
            assert await read_message(dialer) == "/b/1"
    assert result["listener"] == "/b/1"
