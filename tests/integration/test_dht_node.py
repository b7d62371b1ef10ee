"""DHT driver over real Hosts (in-memory transport and loopback TCP): store/get, batching,
expert declarations, tombstones on leave, bad input over the wire, client mode."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import msgpack
import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.beam import find_best_experts
from volunteer.dht.grid import get_experts
from volunteer.dht.messages import frame
from volunteer.dht.node import open_dht
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.streams import BufferedStream
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

CONFIG = DHTConfig(swarm_id="test", expert_update_period=1.0, expert_expiration=3.0)
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


async def swarm(stack: AsyncExitStack, n: int, *, network=None, config=CONFIG, client=()):
    """n hosts with DHT nodes, each bootstrapped from the first."""
    network = network or MemoryNetwork()
    nodes = []
    for i in range(n):
        host = await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
        )
        boot = [nodes[0].host.full_addrs()[0]] if nodes else []
        dht = await stack.enter_async_context(open_dht(host, config, bootstrap=boot, client_mode=i in client))
        nodes.append(dht)
    return nodes


async def test_store_and_get_across_a_small_swarm():
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 6)
        copies = await nodes[1].store(b"greeting", b"hello", time.time() + 60)
        assert copies >= 6  # k=20 > 6: every node holds it (the publisher included)
        for node in nodes:
            records = await node.get(b"greeting")
            assert [r.value for r in records.values()] == [b"hello"]
        assert await nodes[3].get(b"absent") == {}


async def test_newest_expiration_wins_and_tombstone_deletes():
    async with AsyncExitStack() as stack:
        a, b, c = await swarm(stack, 3)
        now = time.time()
        await a.store(b"k", b"old", now + 30)
        await a.store(b"k", b"new", now + 40)
        await a.store(b"k", b"older", now + 35)  # stale: refused everywhere
        assert [r.value for r in (await c.get(b"k")).values()] == [b"new"]
        await a.store(b"k", None, now + 40)
        assert await b.get(b"k") == {}


async def test_get_many_batches_keys_per_peer():
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        now = time.time()
        await a.store_many([(bytes([i]), a.host.peer_id.to_bytes(), b"v%d" % i, now + 60) for i in range(40)])
        before = b.stats["requests"]
        found = await b.get_many([bytes([i]) for i in range(40)])
        assert all(len(found[bytes([i])]) == 1 for i in range(40))
        assert b.stats["requests"] - before == 1  # one FIND_VALUE carried all 40 keys


async def test_requests_answered_are_counted_beside_those_sent():
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        sent, answered = b.stats["requests"], a.snapshot()["answered"]
        await b.get_many([b"anything"])
        # what b sent, a answered: messages sent per peer are requests plus answers
        assert b.stats["requests"] - sent == a.snapshot()["answered"] - answered == 1


async def test_declared_experts_are_found_and_vanish_on_withdraw():
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 5)
        nursery = await stack.enter_async_context(trio.open_nursery())
        server, trainer = nodes[2], nodes[4]
        uids = [f"ffn.{i}.{j}" for i in range(4) for j in range(4)]
        declarer = ExpertDeclarer(server, uids, loads=lambda: {"ffn.1.2": 5.0})
        await nursery.start(declarer.run, declarer.host)
        with trio.fail_after(5):
            while declarer.last_declared is None:
                await trio.sleep(0.05)
        found = await get_experts(trainer, ["ffn.0.0", "ffn.3.3", "ffn.9.9"])
        assert [d.peer for d in found["ffn.0.0"]] == [server.host.peer_id]
        assert found["ffn.9.9"] == []
        scores = [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 2.0, 0.0]]
        best = await find_best_experts(trainer, "ffn", scores, beam_size=3)
        assert best[0].uid == "ffn.3.2" and best[0].hosts[0].peer == server.host.peer_id
        assert len(best) == 3
        started = trio.current_time()
        await declarer.pause()
        assert trio.current_time() - started < 2
        assert (await get_experts(trainer, ["ffn.0.0"]))["ffn.0.0"] == []
        assert await find_best_experts(trainer, "ffn", scores, beam_size=3) == []
        declarer.resume()
        with trio.fail_after(5):
            while not (await get_experts(trainer, ["ffn.0.0"]))["ffn.0.0"]:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_lookups_still_run_once_the_dht_service_stopped():
    # a node's services stop together: a declarer's last withdraw may run once the DHT's own
    # tasks are gone, and its lookups must still reach the peers that hold its declarations
    network = MemoryNetwork()
    async with AsyncExitStack() as stack:
        boot, trainer = await swarm(stack, 2, network=network)
        host = await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
        )
        async with open_dht(host, CONFIG, bootstrap=[boot.host.full_addrs()[0]]) as leaver:
            assert await leaver.store(b"k", b"v", time.time() + 60) > 1
        with trio.fail_after(5):
            assert await leaver.store(b"k", None, time.time() + 60) > 1
        assert await trainer.get(b"k") == {}


@pytest.mark.slow
async def test_crashed_host_experts_expire():
    config = DHTConfig(swarm_id="test", expert_update_period=0.3, expert_expiration=1.0)
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 3, config=config)
        async with trio.open_nursery() as nursery:
            declarer = ExpertDeclarer(nodes[1], ["ffn.0"])
            await nursery.start(declarer.run, declarer.host)
            while declarer.last_declared is None:
                await trio.sleep(0.02)
            assert (await get_experts(nodes[2], ["ffn.0"]))["ffn.0"]
            declarer.withdraw = _no_withdraw  # a crash: nobody publishes tombstones
            nursery.cancel_scope.cancel()
        await trio.sleep(1.1)
        assert (await get_experts(nodes[2], ["ffn.0"]))["ffn.0"] == []


async def _no_withdraw() -> int:
    return 0


async def test_bad_input_gets_typed_error_replies_and_is_counted():
    async with AsyncExitStack() as stack:
        a, b = await swarm(stack, 2)
        stream = BufferedStream(await b.host.new_stream(a.host.peer_id, [CONFIG.protocol_id]))
        for body in (b"\xc1garbage", msgpack.packb({"op": "store", "rs": "x"}), msgpack.packb([1, 2])):
            await stream.send_all(frame(body))
            reply = msgpack.unpackb(await stream.receive_length_prefixed(1 << 20))
            assert reply["op"] == "error" and reply["code"] == "malformed"
        # a record under a sub-key the sender does not own (a's PeerID) is refused, not stored
        from volunteer.dht.records import Record, signing_payload

        payload = signing_payload(b"k", a.host.peer_id.to_bytes(), b"forged", time.time() + 60)
        forged = Record(b"k", a.host.peer_id.to_bytes(), b"forged", time.time() + 60, b.host.peer_id, b.host.keypair.sign(payload))
        state = b.state
        response = await b.request(
            next(e.contact for e in b.state.table.entries()), state.store_request([forged])
        )
        assert response.codes[0] not in ("ok", "stale")
        assert a.snapshot()["rejected"]["malformed"] == 3
        assert sum(a.snapshot()["rejected"].values()) >= 4
        assert await a.get(b"k") == {}


async def test_client_mode_nodes_are_not_routed_to():
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 4, client=(3,))
        await nodes[3].store(b"from-client", b"v", time.time() + 60)
        for node in nodes[:3]:
            assert nodes[3].host.peer_id not in node.state.table
        assert (await nodes[1].get(b"from-client"))  # it could still store


async def test_tcp_loopback_pair():
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as h1, open_stack(
        listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET
    ) as h2:
        async with open_dht(h1, CONFIG) as d1, open_dht(h2, CONFIG, bootstrap=[h1.full_addrs()[0]]) as d2:
            assert await d2.store(b"x", b"y", time.time() + 10) == 2
            assert (await d1.get(b"x"))


async def test_list_experts_walks_the_grid():
    from volunteer.dht.grid import list_experts

    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 3)
        a = ExpertDeclarer(nodes[0], ["expert.0.1", "expert.2.3", "expert.2.0"])
        b = ExpertDeclarer(nodes[1], ["expert.2.3", "other.1"])
        await a.declare_once()
        await b.declare_once()
        listed = await list_experts(nodes[2], "expert.")
        assert sorted(listed) == ["expert.0.1", "expert.2.0", "expert.2.3"]
        assert {d.peer for d in listed["expert.2.3"]} == {nodes[0].host.peer_id, nodes[1].host.peer_id}
        assert list(await list_experts(nodes[2], "other")) == ["other.1"]
        await a.withdraw()
        assert sorted(await list_experts(nodes[2], "expert.")) == ["expert.2.3"]


@pytest.mark.trio_timeout(2000)  # virtual seconds (autojump clock)
async def test_own_records_are_republished(autojump_clock):
    from volunteer.dht.records import Storage

    async with AsyncExitStack() as stack:
        network = MemoryNetwork()
        nodes = []
        for i in range(4):
            host = await stack.enter_async_context(
                open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET))
            boot = [nodes[0].host.full_addrs()[0]] if nodes else []
            nodes.append(await stack.enter_async_context(open_dht(host, CONFIG, bootstrap=boot, clock=trio.current_time)))
        await nodes[1].store(b"long-lived", b"v", trio.current_time() + 3000, republish=True)
        for node in (nodes[0], nodes[2], nodes[3]):
            node.state.storage = Storage(CONFIG)  # the holders lose it (restarted volunteers)
        nodes[1].state.storage = Storage(CONFIG)
        assert await nodes[2].get(b"long-lived") == {}
        await trio.sleep(700)  # past one re-publication period
        assert [r.value for r in (await nodes[2].get(b"long-lived")).values()] == [b"v"]


@pytest.mark.slow
async def test_recent_lookups_are_reused_only_within_max_age():
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 4)
        server, trainer = nodes[1], nodes[3]
        declarer = ExpertDeclarer(server, ["ffn.0.1", "ffn.1.0"])
        await declarer.declare_once()
        scores = [[1.0, 0.0], [0.0, 1.0]]
        best = await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=5.0)
        assert [m.uid for m in best] == ["ffn.0.1", "ffn.1.0"]
        before = trainer.stats["requests"]
        again = await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=5.0)
        assert [m.uid for m in again] == ["ffn.0.1", "ffn.1.0"]
        assert trainer.stats["requests"] == before  # answered from the lookups just made
        await declarer.withdraw()
        # the holders forwarded the tombstones to the trainer before the withdrawal returned:
        # the cached lookups are gone, the next search asks again and finds nothing
        assert await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=5.0) == []
        assert await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=0) == []  # asks
        assert trainer.stats["requests"] > before
        # every lookup refreshes what later calls may reuse
        assert await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=5.0) == []
        await declarer.declare_once()
        await trio.sleep(0.3)
        assert len(await find_best_experts(trainer, "ffn", scores, beam_size=2, max_age=0.2)) == 2  # too old: asks


async def test_a_store_asks_the_peers_it_stores_on_once():
    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 8)
        writer = nodes[5]
        replicas = writer.config.store_replicas
        before = writer.stats["requests"]
        assert await writer.store(b"fresh-key", b"v", time.time() + 60) >= replicas
        # the lookup's questions to the closest peers were the STOREs themselves: a lookup of its
        # own would have cost at least alpha FIND_NODEs on top of the replicas STOREs
        assert writer.stats["requests"] - before < replicas + writer.config.alpha
        holders = [n for n in nodes if n.state.storage.get(b"fresh-key", time.time())]
        assert len(holders) >= replicas


@pytest.mark.parametrize("crawl", [0, 16])
async def test_a_trainers_crawl_fills_its_wide_table_with_the_servers(crawl, autojump_clock):
    """A trainer (client mode, wide buckets) joins through one server of 24 whose tables hold 4
    contacts a bucket: its self-lookup alone meets few of them; its crawl (16 lookups spread over
    the key space, 4 at a time) meets nearly all, each timed by its answer."""
    servers_config = DHTConfig(swarm_id="test", k=4)
    trainer_config = DHTConfig(swarm_id="test", k=4, bucket_size=64, crawl_lookups=crawl)
    async with AsyncExitStack() as stack:
        network = MemoryNetwork()
        servers = await swarm(stack, 24, network=network, config=servers_config)
        host = await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET))
        trainer = await stack.enter_async_context(open_dht(
            host, trainer_config, bootstrap=[servers[5].host.full_addrs()[0]], client_mode=True, clock=trio.current_time))
        await trio.sleep(30)
        known = {entry.contact.peer for entry in trainer.state.table.entries()}
        everyone = {server.host.peer_id for server in servers}
        if crawl:
            assert len(known & everyone) >= 22
            assert all(trainer.state.table.rtt(peer) is not None for peer in known - {servers[5].host.peer_id})
        else:
            assert len(known & everyone) < 22
