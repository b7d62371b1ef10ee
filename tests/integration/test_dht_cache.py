"""Beam search's cache (on by default) over real Hosts: repeated searches are answered locally,
and a leaver's experts are gone from the very next search after its withdrawal returns; declared
versions reach every lookup."""

from __future__ import annotations

import pytest

from contextlib import AsyncExitStack

import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.beam import find_best_experts
from volunteer.dht.grid import get_experts
from volunteer.dht.node import open_dht
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

CONFIG = DHTConfig(swarm_id="cache")
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
SIDE = 8
LEAVER_UIDS = [f"expert.{i}.{j}" for i in range(4) for j in range(SIDE)]  # the best rows
STAYER_UIDS = [f"expert.{i}.{j}" for i in range(4, SIDE) for j in range(0, SIDE, 2)]
# the leaver's rows score highest: a search that still saw them would return them
SCORES = [[float(SIDE - i) for i in range(SIDE)], [0.1 * j for j in range(SIDE)]]


async def swarm(stack: AsyncExitStack, n: int, config: DHTConfig = CONFIG):
    network = MemoryNetwork()
    nodes = []
    for _ in range(n):
        host = await stack.enter_async_context(
            open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
        )
        boot = [nodes[0].host.full_addrs()[0]] if nodes else []
        nodes.append(await stack.enter_async_context(open_dht(host, config, bootstrap=boot)))
    return nodes


@pytest.mark.slow
async def test_leaver_is_absent_from_the_first_search_after_its_withdrawal():
    async with AsyncExitStack() as stack:
        # declarations go to 5 of the 11 other nodes, so some of the 9 trainers hold none (with the
        # default 9 replicas, all 9 did whenever the other two nodes were the 2 left out)
        nodes = await swarm(stack, 12, DHTConfig(swarm_id="cache", expert_replicas=5))
        leaver, stayer = ExpertDeclarer(nodes[1], LEAVER_UIDS), ExpertDeclarer(nodes[2], STAYER_UIDS)
        await leaver.declare_once()
        await stayer.declare_once()
        trainers = nodes[3:]
        for trainer in trainers:
            best = await find_best_experts(trainer, "expert", SCORES, beam_size=4)
            assert [m.uid for m in best] == ["expert.0.7", "expert.0.6", "expert.0.5", "expert.0.4"]
            before = trainer.stats["requests"]
            again = await find_best_experts(trainer, "expert", SCORES, beam_size=4)
            assert again == best and trainer.stats["requests"] == before  # the default cached it
        # trainers holding none of the leaver's records can only learn of its leave from holders
        outsiders = [t for t in trainers if not t.state.storage.get(b"expert.0.", t.clock())]
        assert outsiders
        await leaver.withdraw()
        gone = set(LEAVER_UIDS)
        for trainer in trainers:
            best = await find_best_experts(trainer, "expert", SCORES, beam_size=4)
            assert [m.uid for m in best] == ["expert.4.6", "expert.4.4", "expert.4.2", "expert.4.0"]
            assert not gone & {m.uid for m in best}
        assert sum(n.stats["forwards"] for n in nodes) >= len(outsiders)  # the holders told them


async def test_declaring_again_shows_within_the_cache_age():
    config = DHTConfig(swarm_id="cache", expert_cache_age=0.3, watch_age=0.6)
    async with AsyncExitStack() as stack:
        network = MemoryNetwork()
        nodes = []
        for _ in range(4):
            host = await stack.enter_async_context(
                open_stack(listen=["/memory/0"], transports=[MemoryTransport(network)], options=QUIET)
            )
            boot = [nodes[0].host.full_addrs()[0]] if nodes else []
            nodes.append(await stack.enter_async_context(open_dht(host, config, bootstrap=boot)))
        declarer = ExpertDeclarer(nodes[1], LEAVER_UIDS)
        await declarer.declare_once()
        trainer = nodes[3]
        assert len(await find_best_experts(trainer, "expert", SCORES, beam_size=4)) == 4
        await declarer.withdraw()
        assert await find_best_experts(trainer, "expert", SCORES, beam_size=4) == []
        await declarer.declare_once()  # back: a new declaration is not pushed, the cache ages out
        with trio.fail_after(5):
            while len(await find_best_experts(trainer, "expert", SCORES, beam_size=4)) < 4:
                await trio.sleep(0.05)
        assert (await get_experts(trainer, ["expert.0.0"]))["expert.0.0"]


async def test_declared_versions_reach_every_lookup():
    from volunteer.dht.grid import grid_experts, walk_grid

    async with AsyncExitStack() as stack:
        nodes = await swarm(stack, 4)
        versions = {"expert.0.1": 12, "expert.1.3": 0}
        declarer = ExpertDeclarer(nodes[1], sorted(versions), versions=lambda uid: versions[uid])
        await declarer.declare_once()
        trainer = nodes[3]
        found = await get_experts(trainer, sorted(versions))
        assert {uid: [d.version for d in hosts] for uid, hosts in found.items()} == {"expert.0.1": [12], "expert.1.3": [0]}
        walked = await walk_grid(trainer, "expert", depth=2)
        assert {uid: [d.version for d in hosts] for uid, hosts in walked.items()} == {"expert.0.1": [12], "expert.1.3": [0]}
        versions["expert.0.1"] = 13  # read afresh at every heartbeat
        await declarer.declare_once()
        grid = await grid_experts(trainer, "expert", 2)
        assert [d.version for d in grid["expert.0.1"]] == [13]
        best = await find_best_experts(trainer, "expert", [[1.0, 0.0], [0.0, 1.0, 0.0, 0.0]], beam_size=1, max_age=0)
        assert [(m.uid, m.hosts[0].version) for m in best] == [("expert.0.1", 13)]
