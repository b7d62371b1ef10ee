"""The DHT over real TCP on loopback: a 16-host swarm, joining 100 times in a row, and peers that
start together from the same bootstrap peer converging into one DHT (hivemind #624, #634)."""

from __future__ import annotations

import random
import time
from contextlib import AsyncExitStack

import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.beam import find_best_experts
from volunteer.dht.node import open_dht
from volunteer.net.stack import StackOptions, open_stack

CONFIG = DHTConfig(swarm_id="tcp", expert_update_period=1.0, expert_expiration=3.0)
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
LOOPBACK = "/ip4/127.0.0.1/tcp/0"


async def add_node(stack: AsyncExitStack, boot=()):
    host = await stack.enter_async_context(open_stack(listen=[LOOPBACK], options=QUIET))
    return await stack.enter_async_context(open_dht(host, CONFIG, bootstrap=list(boot)))


@pytest.mark.slow
async def test_sixteen_hosts_store_get_and_experts():
    rng = random.Random(3)
    async with AsyncExitStack() as stack:
        nodes = [await add_node(stack)]
        for _ in range(15):
            nodes.append(await add_node(stack, [rng.choice(nodes).host.full_addrs()[0]]))
        for i in range(20):
            assert await nodes[rng.randrange(16)].store(b"k%d" % i, b"v%d" % i, time.time() + 60) >= CONFIG.store_replicas
        for i in range(20):
            for asker in rng.sample(nodes, 4):
                assert [r.value for r in (await asker.get(b"k%d" % i)).values()] == [b"v%d" % i]
        declarers = [ExpertDeclarer(nodes[i], [f"ffn.{i}.{j}" for j in range(3)]) for i in range(4)]
        for declarer in declarers:
            await declarer.declare_once()
        best = await find_best_experts(nodes[10], "ffn", [[0, 0, 0.5, 5.0], [1.0, 0.5, 0]], beam_size=2)
        assert [m.uid for m in best] == ["ffn.3.0", "ffn.3.1"]
        assert best[0].hosts[0].peer == nodes[3].host.peer_id
        started = time.monotonic()
        await declarers[3].withdraw()
        best = await find_best_experts(nodes[10], "ffn", [[0, 0, 0.5, 5.0], [1.0, 0.5, 0]], beam_size=2)
        assert time.monotonic() - started < 2.0
        assert [m.uid for m in best] == ["ffn.2.0", "ffn.2.1"]  # host 3's experts are gone


@pytest.mark.slow
@pytest.mark.trio_timeout(600)  # 100 joins: about 10 s here, far slower on a loaded CI machine
async def test_joining_one_hundred_times_in_a_row_never_fails():
    async with AsyncExitStack() as stack:
        bootstrap = await add_node(stack)
        members = [await add_node(stack, [bootstrap.host.full_addrs()[0]]) for _ in range(5)]
        await members[2].store(b"anchor", b"here", time.time() + 600)
        boot_addr = bootstrap.host.full_addrs()[0]
        for attempt in range(100):
            async with open_stack(listen=[LOOPBACK], options=QUIET) as host:
                async with open_dht(host, CONFIG, bootstrap=[boot_addr], client_mode=attempt % 2 == 1) as dht:
                    assert len(dht.state.table) >= 3, (
                        f"join {attempt} ended with {len(dht.state.table)} peers; bootstrap's table: "
                        f"{[(e.failures, any(m.host.peer_id == e.contact.peer for m in members)) for e in bootstrap.state.table.entries()]}"
                    )
                    assert [r.value for r in (await dht.get(b"anchor")).values()] == [b"here"], f"join {attempt}"


@pytest.mark.slow
async def test_peers_started_together_form_one_dht():
    async with AsyncExitStack() as stack:
        bootstrap = await add_node(stack)
        addr = bootstrap.host.full_addrs()[0]
        nodes = []
        for _ in range(12):
            host = await stack.enter_async_context(open_stack(listen=[LOOPBACK], options=QUIET))
            nodes.append(await stack.enter_async_context(open_dht(host, CONFIG, bootstrap=[addr], wait_bootstrap=False)))
        async with trio.open_nursery() as nursery:  # all twelve join at the same moment
            for node in nodes:
                nursery.start_soon(node.bootstrap)
        everyone = {n.host.peer_id for n in nodes} | {bootstrap.host.peer_id}
        with trio.fail_after(30):  # about 2 s here; CI machines have been 5x slower
            while True:
                # with fewer peers than k, one DHT means everybody knows everybody
                missing = [len(everyone - {n.host.peer_id} - set(e.contact.peer for e in n.state.table.entries())) for n in nodes]
                if not any(missing):
                    break
                await trio.sleep(0.2)  # no help from the test: self-lookups and inbound requests must do it
        await nodes[0].store(b"shared", b"1", time.time() + 60)
        for n in nodes:
            assert await n.get(b"shared")
