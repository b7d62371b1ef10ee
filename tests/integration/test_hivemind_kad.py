"""``/ipfs/kad/1.0.0`` peer routing over real Hosts (memory transport): a node reaches another by
peer id alone through a peer both are connected to; the hivemind DHT calls peers named by id only."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from volunteer.hivemind import HivemindDHT, HivemindError
from volunteer.hivemind.kad import KadPeerRouting
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.identity import KeyPair
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport
from volunteer.net.identify import identify_of

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def three_hosts(stack: AsyncExitStack, services):
    """a — middle — c: a and c each connected to the middle only."""
    network = MemoryNetwork()
    hosts = [
        await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=list(extra))
        )
        for extra in services
    ]
    a, middle, c = hosts
    await a.connect(middle.full_addrs()[0])
    await c.connect(middle.full_addrs()[0])
    await identify_of(a).ask(middle.peer_id)
    await identify_of(c).ask(middle.peer_id)
    return a, middle, c


@pytest.mark.trio_timeout(30)
async def test_a_peer_is_reached_by_id_through_a_shared_peer():
    async with AsyncExitStack() as stack:
        kads = [KadPeerRouting() for _ in range(3)]
        a, middle, c = await three_hosts(stack, [[k] for k in kads])
        assert not c.peerstore.addrs(a.peer_id)
        assert await kads[2].ping(middle.peer_id)
        addrs = await kads[2].find_peer(a.peer_id)
        assert addrs and set(addrs) <= set(a.listen_addrs) | set(a.full_addrs()) | set(a.addrs)
        await kads[2].connect(a.peer_id)
        assert c.is_connected(a.peer_id)
        assert kads[1].answered >= 2
        with pytest.raises(HivemindError, match="knows where"):
            await kads[0].find_peer(KeyPair.generate().peer_id)


@pytest.mark.trio_timeout(30)
async def test_the_hivemind_dht_reaches_nearest_peers_named_by_id_only():
    async with AsyncExitStack() as stack:
        dhts = [HivemindDHT() for _ in range(3)]
        kads = [KadPeerRouting() for _ in range(3)]
        a, middle, c = await three_hosts(stack, [[d, k] for d, k in zip(dhts, kads)])
        # a and c learn each other's node ids (not addresses) through the middle's DHT
        await dhts[0].bootstrap([middle.full_addrs()[0]])
        await dhts[2].bootstrap([middle.full_addrs()[0]])
        assert not a.is_connected(c.peer_id) and not a.peerstore.addrs(c.peer_id)
        # a's store asks the nodes nearest the key, c among them, known to a by node id only:
        # c's address comes from kad (the middle answers FIND_NODE)
        assert await dhts[0].store("key", "value", dhts[0].clock() + 60)
        assert a.is_connected(c.peer_id) and kads[1].answered >= 1
        assert c.peerstore.addrs(a.peer_id) or c.is_connected(a.peer_id)
        found = await dhts[2].get("key")
        assert found is not None and found.value == "value"
