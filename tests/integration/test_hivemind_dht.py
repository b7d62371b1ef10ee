"""The hivemind DHT service between our own Hosts (memory transport): ping, store, find,
dictionary values, client mode, bad requests answered with errors while the node keeps serving."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import trio

from volunteer.hivemind import DictionaryValue, HivemindDHT, HivemindRPCError, key_id
from volunteer.hivemind.dht_protocol import FIND, STORE
from volunteer.hivemind.pb import hm_dht_pb2 as pb
from volunteer.hivemind.rpc import call_unary
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def swarm(stack: AsyncExitStack, n: int, *, client=()) -> list[HivemindDHT]:
    network = MemoryNetwork()
    nodes: list[HivemindDHT] = []
    for i in range(n):
        dht = HivemindDHT(client_mode=i in client)
        host = await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET, services=[dht])
        )
        assert host.service(HivemindDHT) is dht
        if nodes:
            assert await dht.bootstrap([nodes[0].host.full_addrs()[0]]) == 1
        nodes.append(dht)
    return nodes


@pytest.mark.trio_timeout(30)
async def test_store_and_get_across_nodes():
    async with AsyncExitStack() as stack:
        a, b, c = await swarm(stack, 3)
        expiration = time.time() + 60
        assert await c.store("expert.0", ("peer", 1), expiration)
        found = await b.get("expert.0")
        assert found is not None and found.value == ("peer", 1) and found.expiration_time == expiration
        # a newer expiration wins, an older one is refused
        assert await a.store("expert.0", "newer", expiration + 10)
        assert (await c.get("expert.0")).value == "newer"
        assert await b.get("missing") is None


@pytest.mark.trio_timeout(30)
async def test_dictionary_values_merge_subkeys():
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        now = time.time()
        assert await a.store("grid", "x", now + 30, subkey="s1")
        assert await b.store("grid", "y", now + 40, subkey=("s", 2))
        found = await a.get("grid")
        assert isinstance(found.value, DictionaryValue)
        assert {k: v.value for k, v in found.value.items.items()} == {"s1": "x", ("s", 2): "y"}
        assert found.expiration_time == now + 40


@pytest.mark.trio_timeout(30)
async def test_client_mode_serves_nothing_but_can_ask():
    async with AsyncExitStack() as stack:
        server, client = await swarm(stack, 2, client=(1,))
        assert await client.store("k", 1, time.time() + 30)
        assert len(client.core.storage) == 0 and len(server.core.storage) == 1
        assert (await client.get("k")).value == 1
        # the server did not add the client to its contacts: it sent no node id
        assert len(server.core.contacts) == 0


@pytest.mark.trio_timeout(30)
async def test_bad_requests_get_error_replies_and_the_node_keeps_serving():
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        peer = a.host.peer_id
        with pytest.raises(HivemindRPCError):
            await call_unary(b.host, peer, FIND, b"\xff\xff\xff", timeout=5)
        misaligned = pb.StoreRequest(keys=[b"\x00" * 20], values=[], expiration_time=[1.0])
        with pytest.raises(HivemindRPCError, match="aligned"):
            await call_unary(b.host, peer, STORE, misaligned.SerializeToString(), timeout=5)
        with pytest.raises(HivemindRPCError, match="authorizer"):
            await call_unary(b.host, peer, FIND, pb.FindRequest(auth=b"x").SerializeToString(), timeout=5)
        # raw garbage on the stream: the stream is reset, the node is fine
        stream = await b.host.new_stream(peer, [FIND])
        await stream.send_all(b"\xff" * 20)
        with trio.move_on_after(5):
            try:
                await stream.receive_some()
            except trio.BrokenResourceError:
                pass
        assert await b.ping(peer) == a.node_id
        assert (await b.find_at(peer, [key_id("nothing")]))[0].value is None
