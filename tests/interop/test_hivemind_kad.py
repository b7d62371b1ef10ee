"""``/ipfs/kad/1.0.0`` against a real hivemind 1.1.12 peer (its own venv, its p2pd's go-libp2p-kad-dht).

Two of our nodes, ``target`` and ``hub``, are connected; the hivemind peer knows only ``hub``.
hivemind pings ``target`` by peer id alone: its p2pd asks ``hub`` FIND_NODE over kad, dials the
address ``hub`` names, and our DHT answers. The other way, ``target`` reaches the hivemind peer by
id through ``hub`` and pings it over hivemind's DHT.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from volunteer.hivemind import HivemindDHT
from volunteer.hivemind import kad_wire
from volunteer.hivemind.kad import KadPeerRouting
from volunteer.net.stack import open_stack
from volunteer.net.identify import identify_of

from .test_hivemind_dht import QUIET, hivemind_peer

pytestmark = pytest.mark.interop


@pytest.mark.trio_timeout(180)
async def test_hivemind_and_we_reach_each_other_by_peer_id_through_a_shared_peer():
    async with AsyncExitStack() as stack:
        nodes = []
        for _ in range(3):
            dht, kad = HivemindDHT(), KadPeerRouting()
            host = await stack.enter_async_context(
                open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET, services=[dht, kad])
            )
            nodes.append((host, dht, kad))
        (target, target_dht, _), (hub, _, hub_kad), (late, late_dht, late_kad) = nodes
        await target.connect(hub.full_addrs()[0])
        await identify_of(target).ask(hub.peer_id)
        # the hivemind peer is given the hub's address only
        hivemind = await stack.enter_async_context(hivemind_peer(str(hub.full_addrs()[0])))
        reply = await hivemind.command(op="ping", peer_id=target.peer_id.to_base58())
        assert reply["node_id"] == f"{target_dht.node_id:040x}", reply
        # nothing but our hub's kad answers told hivemind's p2pd where target listens
        assert hub_kad.answered >= 1 and target.is_connected(hivemind.peer_id)

        # the other way: a node of ours that knows only the hub reaches the hivemind peer by id
        await late.connect(hub.full_addrs()[0])
        await identify_of(late).ask(hub.peer_id)
        assert not late.peerstore.addrs(hivemind.peer_id)
        await late_kad.connect(hivemind.peer_id)
        assert await late_dht.ping(hivemind.peer_id) is not None
        # and go-libp2p-kad-dht answers our FIND_NODE: it names target, with addresses
        answer = await late_kad.request(hivemind.peer_id, kad_wire.find_node_request(target.peer_id))
        named = {known.peer: known for known in kad_wire.closer_peers(answer)}
        assert target.peer_id in named and named[target.peer_id].addrs
        assert await late_kad.ping(hivemind.peer_id)
