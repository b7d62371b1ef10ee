"""Circuit relay v2 end to end on the in-memory transport: reserve, connect through, limits, refusals."""

from __future__ import annotations

import os

import pytest
import trio

from relay.limits import RelayLimits
from relay.service import HopService
from volunteer.errors import DialError
from volunteer.net.transport.base import Path
from volunteer.net.stack import open_stack
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat import circuit
from volunteer.net.nat.relay_client import ReservationManager, reserve
from volunteer.net.streams import BufferedStream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

ECHO = "/test/echo/1.0.0"


async def echo(stream):
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


async def roundtrip(stream, payload: bytes) -> bytes:
    received = bytearray()
    async with trio.open_nursery() as nursery:
        async def send():
            await stream.send_all(payload)
            await stream.send_eof()

        nursery.start_soon(send)
        while data := await stream.receive_some(1 << 20):
            received += data
    return bytes(received)


async def test_reserve_and_connect_through_relay():
    network = MemoryNetwork()
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)]) as relay, open_stack(
            transports=[MemoryTransport(network)]
        ) as a, open_stack(transports=[MemoryTransport(network)]) as b, trio.open_nursery() as nursery:
            service = HopService()
            await relay.add_service(service)
            a.set_handler(ECHO, echo)
            reservation = await reserve(a, relay.full_addrs()[0])
            assert reservation.relay == relay.peer_id and reservation.ttl > 3000
            assert reservation.limit.data == service.limits.circuit_data
            assert reservation.voucher
            target = reservation.circuit_addrs[0].encapsulate(f"/p2p/{a.peer_id}")
            stream = await b.new_stream(target, [ECHO])
            assert stream.connection.path is Path.RELAYED and stream.connection.relay_peer == relay.peer_id
            payload = os.urandom(600_000)
            assert await roundtrip(stream, payload) == payload
            # A sees B over a relayed connection too.
            conn_at_a = a.connection_to(b.peer_id)
            assert conn_at_a.path is Path.RELAYED and conn_at_a.describe_path().startswith("relayed via")
            assert service.resources.bytes_relayed > 2 * len(payload)
            nursery.cancel_scope.cancel()


async def test_refusals_use_spec_codes():
    network = MemoryNetwork()
    limits = RelayLimits(max_reservations=1, max_circuits_per_peer=1)
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)]) as relay, open_stack(
            transports=[MemoryTransport(network)]
        ) as a, open_stack(transports=[MemoryTransport(network)]) as b, trio.open_nursery() as nursery:
            service = HopService(limits)
            await relay.add_service(service)
            # No reservation for B yet: NO_RESERVATION.
            target = relay.full_addrs()[0].encapsulate(f"/p2p-circuit/p2p/{b.peer_id}")
            with pytest.raises(DialError, match="NO_RESERVATION"):
                await a.connect(target)
            await reserve(a, relay.full_addrs()[0])
            # The relay is full: B's reservation is refused.
            with pytest.raises(DialError, match="RESERVATION_REFUSED"):
                await reserve(b, relay.full_addrs()[0])
            assert service.resources.refusals["max_reservations"] == 1
            # Malformed hop message: MALFORMED_MESSAGE, stream closed.
            stream = BufferedStream(await b.new_stream(relay.peer_id, [circuit.HOP]))
            await stream.send_all(b"\x05\xff\xff\xff\xff\xff")
            reply = await circuit.read_message(stream, circuit.HopMessage)
            assert reply.status == circuit.MALFORMED_MESSAGE
            # A STATUS message is not a request: UNEXPECTED_MESSAGE.
            stream = BufferedStream(await b.new_stream(relay.peer_id, [circuit.HOP]))
            await circuit.write_message(stream, circuit.HopMessage(type=circuit.HopMessage.STATUS))
            reply = await circuit.read_message(stream, circuit.HopMessage)
            assert reply.status == circuit.UNEXPECTED_MESSAGE
            nursery.cancel_scope.cancel()


async def test_circuit_data_limit_resets_both_sides():
    network = MemoryNetwork()
    limits = RelayLimits(circuit_data=200_000)
    with trio.fail_after(30):
        async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)]) as relay, open_stack(
            transports=[MemoryTransport(network)]
        ) as a, open_stack(transports=[MemoryTransport(network)]) as b, trio.open_nursery() as nursery:
            service = HopService(limits)
            await relay.add_service(service)
            a.set_handler(ECHO, echo)
            await reserve(a, relay.full_addrs()[0])
            target = relay.full_addrs()[0].encapsulate(f"/p2p-circuit/p2p/{a.peer_id}")
            stream = await b.new_stream(target, [ECHO])
            broke = False
            try:
                await roundtrip(stream, os.urandom(1_000_000))
            except* (trio.BrokenResourceError, trio.ClosedResourceError):
                broke = True
            assert broke, "a circuit over its data limit must be reset"
            with trio.fail_after(5):
                while a.connections(b.peer_id) or b.connections(a.peer_id):
                    await trio.sleep(0.01)
            assert service.resources.refusals["circuit_limit"] == 1
            assert service.resources.open_circuits == 0
            nursery.cancel_scope.cancel()


async def test_reservation_manager_advertises_and_recovers_after_relay_restart(autojump_clock):
    network = MemoryNetwork()
    relay_key = KeyPair.generate()
    with trio.fail_after(120):
        async with open_stack(transports=[MemoryTransport(network)]) as a, open_stack(
            transports=[MemoryTransport(network)]
        ) as b, trio.open_nursery() as outer:
            a.set_handler(ECHO, echo)
            relay_cm = open_stack(
                relay_key, listen=["/memory/4242"], transports=[MemoryTransport(network)],
                services=[HopService(RelayLimits(reservation_ttl=120))],
            )
            await relay_cm.__aenter__()
            relay_addr = Multiaddr(f"/memory/4242/p2p/{relay_key.peer_id}")
            manager = ReservationManager([relay_addr], want=1, max_backoff=2.0)
            await a.add_service(manager)
            while not manager.reservations:
                await trio.sleep(0.1)
            circuit_addr = manager.circuit_addrs()[0]
            assert circuit_addr in a.addrs  # advertised through identify
            first = manager.reservations[0]
            # Refreshed before it expires (ttl 120 s: refresh at 90 s).
            await trio.sleep(100)
            assert manager.reservations and manager.reservations[0] is not first
            # The relay goes away and comes back on the same address with the same identity.
            await relay_cm.__aexit__(None, None, None)
            while manager.reservations:
                await trio.sleep(0.1)
            async with open_stack(
                relay_key, listen=["/memory/4242"], transports=[MemoryTransport(network)], services=[HopService()]
            ):
                while not manager.reservations:
                    await trio.sleep(0.5)
                stream = await b.new_stream(circuit_addr.encapsulate(f"/p2p/{a.peer_id}"), [ECHO])
                assert await roundtrip(stream, b"back again") == b"back again"
            outer.cancel_scope.cancel()
