"""Repair datagrams between Hosts on loopback (transport/quic/repair.py): a path that loses
datagrams gets repairs and the receiver rebuilds what was lost; repairs from another address
rebuild nothing; a clean path sends none; a peer that does not speak them never gets any."""

from __future__ import annotations

import os
import socket

import pytest

from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.quic import QuicLimits, QuicTransport
from volunteer.net.transport.quic.repair import KIND_REPAIR, is_repair_datagram

from ..echo import echo, roundtrip

ECHO = "/test/echo/1.0.0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
PAYLOAD = 4 * 1024 * 1024 + 11


def lose_every(host, nth: int, divert_repairs=None) -> dict:
    """Drop every ``nth`` QUIC datagram ``host`` sends after its first 40 (the handshake's pass);
    repairs and hellos pass (repairs through ``divert_repairs(data, addr)`` instead, if given).
    Returns the counts."""
    transport = host.service(QuicTransport)
    endpoint = transport.endpoint_for(socket.AF_INET)
    counts = {"sent": 0, "dropped": 0}
    send = endpoint.send

    def lossy(data: bytes, addr) -> None:
        if divert_repairs is not None and is_repair_datagram(data) and data[1] == KIND_REPAIR:
            divert_repairs(data, addr)
            return
        if not is_repair_datagram(data):
            counts["sent"] += 1
            if counts["sent"] > 40 and counts["sent"] % nth == 0:
                counts["dropped"] += 1
                return
        send(data, addr)

    endpoint.send = lossy  # sessions take the endpoint's send when they start
    return counts


@pytest.mark.trio_timeout(60)
async def test_a_lossy_path_gets_repairs_and_the_receiver_rebuilds_what_was_lost():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        counts = lose_every(b, 13)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        payload = os.urandom(PAYLOAD)
        assert await roundtrip(stream, payload) == payload
        sender = stream.connection.muxer.repair_stats()
        receiver = a.connection_to(b.peer_id).muxer.repair_stats()
        assert counts["dropped"] > 5
        assert sender["repairs"] and receiver["repairs"]
        assert sender["repairs_sent"] > 0
        # most of what was lost after repairs began came back without a retransmission
        assert receiver["rebuilt"] >= counts["dropped"] // 2
        # the sender heard how many were rebuilt: repaired losses keep its repairs on although
        # its loss detection never saw them
        assert sender["rebuilt_by_peer"] == receiver["rebuilt"]
        # a's replies crossed a clean path: no repairs that way
        assert receiver["repairs_sent"] == 0


@pytest.mark.trio_timeout(60)
async def test_repairs_from_another_address_rebuild_nothing():
    """Repairs count only from the connection's own remote address: the same repairs sent from
    another socket (an off-path sender that learned a connection ID) are ignored, and what was
    lost comes back by retransmission."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as elsewhere:
        elsewhere.bind(("127.0.0.2", 0))
        diverted = []

        def from_elsewhere(data: bytes, addr) -> None:
            diverted.append(len(data))
            elsewhere.sendto(data, addr[:2])

        async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
            a.set_handler(ECHO, echo)
            counts = lose_every(b, 13, divert_repairs=from_elsewhere)
            stream = await b.new_stream(a.full_addrs()[0], [ECHO])
            payload = os.urandom(PAYLOAD)
            assert await roundtrip(stream, payload) == payload
            receiver = a.connection_to(b.peer_id).muxer.repair_stats()
            assert counts["dropped"] > 5 and len(diverted) > 5
            assert receiver["repairs"] and receiver["rebuilt"] == 0


@pytest.mark.trio_timeout(60)
async def test_a_clean_path_sends_no_repairs():
    async with open_stack(listen=[QUIC]) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        payload = os.urandom(PAYLOAD // 4)  # well within the socket buffers: loopback loses nothing
        assert await roundtrip(stream, payload) == payload
        for side in (stream.connection, a.connection_to(b.peer_id)):
            stats = side.muxer.repair_stats()
            assert stats["repairs"]  # the hellos were heard both ways
            assert stats["repairs_sent"] == 0 and stats["rebuilt"] == 0


@pytest.mark.trio_timeout(60)
async def test_a_peer_that_does_not_speak_repairs_gets_none():
    quiet = StackOptions(quic=QuicLimits(repairs=False))
    async with open_stack(listen=[QUIC], options=quiet) as a, open_stack(listen=[QUIC]) as b:
        a.set_handler(ECHO, echo)
        counts = lose_every(b, 13)
        stream = await b.new_stream(a.full_addrs()[0], [ECHO])
        payload = os.urandom(PAYLOAD)
        assert await roundtrip(stream, payload) == payload  # QUIC retransmits what was lost
        assert counts["dropped"] > 5
        sender = stream.connection.muxer.repair_stats()
        assert not sender["repairs"] and sender["repairs_sent"] == 0
        assert stream.connection.muxer.engine.datagram_size > 1400  # not shrunk for repairs nobody reads
