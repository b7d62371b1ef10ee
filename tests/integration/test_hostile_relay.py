"""Hostile peers against a relay: circuit and reservation floods (in-memory transport).

The flooding peer is bounded by its own budgets (the resource manager's memory for circuit
buffers, the relay's per-peer rates for reservations); an honest peer still reserves and
connects through the relay, and every refusal is counted and exported as metrics.
"""

from __future__ import annotations

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from relay.limits import RelayLimits
from relay.metrics import prometheus_text
from relay.service import HopService
from volunteer.errors import DialError, StreamReset
from volunteer.net.stack import open_stack
from volunteer.net.nat.relay_client import reserve
from volunteer.net.resources import MEMORY, ResourceLimits, ResourceManager
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

ECHO = "/test/echo/1.0.0"
MiB = 1024 * 1024


async def echo(stream) -> None:
    while data := await stream.receive_some():
        await stream.send_all(data)
    await stream.send_eof()


async def echoes(host, target) -> bool:
    stream = await host.new_stream(target, [ECHO])
    await stream.send_all(b"through the relay")
    await stream.send_eof()
    received = b""
    while chunk := await stream.receive_some():
        received += chunk
    return received == b"through the relay"


@pytest.mark.trio_timeout(60)
async def test_circuit_flood_is_bounded_by_the_sources_budget():
    network = MemoryNetwork()
    # Each circuit holds two 256 KiB splice buffers: 2 MiB per peer is 4 circuits (plus room for
    # the peer's hop requests themselves, so the refusals come from the circuit reservation).
    manager = ResourceManager(ResourceLimits(peer_memory=2 * MiB + 256 * 1024, connection_memory=0))
    transports = lambda: [MemoryTransport(network)]  # noqa: E731
    async with open_stack(listen=["/memory/0"], transports=transports(), services=[manager]) as relay, open_stack(
        transports=transports()
    ) as target, open_stack(transports=transports()) as attacker, open_stack(
        transports=transports()
    ) as honest, trio.open_nursery() as nursery:
        service = HopService(RelayLimits(max_circuits_per_peer=64, buffer_size=256 * 1024))
        await relay.add_service(service)
        target.set_handler(ECHO, echo)
        await reserve(target, relay.full_addrs()[0])
        circuit_addr = relay.full_addrs()[0].encapsulate(f"/p2p-circuit/p2p/{target.peer_id}")
        held, refused = [], 0
        for _ in range(20):  # bounded: 20 circuits asked, at most 4 granted
            try:
                held.append(await attacker.dial_addr(circuit_addr, target.peer_id))
            except (DialError, StreamReset):
                refused += 1
        assert len(held) == 4 and refused == 16
        assert manager.peer_memory(attacker.peer_id) == 4 * 2 * service.limits.buffer_size
        assert manager.memory <= manager.limits.system_memory
        assert await echoes(honest, circuit_addr)  # the honest peer is served during the flood
        assert manager.refusals()["peer"][MEMORY] == 16
        assert service.resources.refusals["RESOURCE_LIMIT_EXCEEDED"] == 16
        # read back with prometheus_client's own parser (it orders labels as it likes in the text)
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(prometheus_text(service)) for s in family.samples}
        assert samples[("volunteer_refusals_total", (("reason", "memory"), ("scope", "peer")))] == 16
        for conn in held:
            await conn.aclose()
        assert manager.peer_memory(attacker.peer_id) <= manager.limits.peer_memory
        assert await echoes(honest, circuit_addr)  # and after it
        nursery.cancel_scope.cancel()


@pytest.mark.trio_timeout(60)
async def test_reservation_flood_is_rate_limited_per_peer():
    network = MemoryNetwork()
    transports = lambda: [MemoryTransport(network)]  # noqa: E731
    async with open_stack(listen=["/memory/0"], transports=transports()) as relay, open_stack(
        transports=transports()
    ) as attacker, open_stack(transports=transports()) as honest, trio.open_nursery() as nursery:
        service = HopService(RelayLimits(reserve_rate_per_peer=10))
        await relay.add_service(service)
        granted = refused = 0
        for _ in range(50):  # bounded
            try:
                await reserve(attacker, relay.full_addrs()[0])
                granted += 1
            except DialError:
                refused += 1
        assert granted == 10 and refused == 40
        assert len(service.resources.reservations) == 1  # refreshes of one reservation, nothing more held
        reservation = await reserve(honest, relay.full_addrs()[0])
        assert reservation.relay == relay.peer_id
        nursery.cancel_scope.cancel()
