"""What a node hosts is decided in one place: on a swarm with grids the node's ``set_aside`` /
``take_back`` (what the donor's self-care asks) go through the replica manager, so a set-aside
expert is withdrawn from the DHT and the runtime, placement counts it as hosted (nothing else
takes its place, nothing re-adds it), and taking it back serves and declares it again."""

from __future__ import annotations

import trio

from volunteer.dht import DHTConfig
from volunteer.dht.grid import get_experts
from volunteer.experts import ExpertsConfig
from volunteer.net.stack import StackOptions
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.replicas import ReplicasConfig
from volunteer.swarmfile import GridSpec, SwarmSpec

SWARM = "donorhosting"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
DHT = DHTConfig(swarm_id=SWARM, expert_update_period=600.0, expert_expiration=1200.0)
CONFIG = ReplicasConfig(sync_timeout=600.0, recheck_period=3600.0, handoff_timeout=10.0)
GRID = GridSpec("rep", (3,), "ffn", 8, replicas=1, sync_period=3600.0)
UIDS = ["rep.0", "rep.1"]


def spec(*bootstrap) -> SwarmSpec:
    return SwarmSpec(SWARM, SWARM, list(bootstrap), [], grids=[GRID])


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT, nat=False, mdns=False,
                experts_config=ExpertsConfig(device="cpu"), replicas_config=CONFIG)
    return VolunteerOptions(**{**base, **changes})


async def hosts_of(dht, uid: str) -> list[str]:
    return [str(d.peer) for d in (await get_experts(dht, [uid]))[uid]]


async def test_set_aside_on_a_grid_goes_through_the_replica_manager_and_placement_respects_it():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(uids=UIDS, max_experts=2)) as node:
            me = str(node.host.peer_id)
            manager = node.replicas
            assert manager is not None and node.parts.hosting is manager  # one part decides
            with trio.fail_after(20):
                while me not in await hosts_of(seed.dht, "rep.0"):
                    await trio.sleep(0.05)
            assert node.hosted() == set(UIDS)

            assert await node.set_aside("rep.0")
            assert not await node.set_aside("rep.2")  # not hosted: nothing to set aside
            assert node.hosted() == {"rep.1"} and "rep.0" not in node.runtime.backends
            assert "rep.0" not in node.declarer.uids and await hosts_of(seed.dht, "rep.0") == []
            # placement counts it as hosted: at capacity, it neither re-adds it nor adds another
            decision = manager.placement({})
            assert "rep.0" not in decision.add and "rep.2" not in decision.add
            assert not await manager.add("rep.0", {})  # only take_back serves it again

            assert node.take_back(["rep.0", "rep.2"]) == ["rep.0"]
            assert node.hosted() == set(UIDS) and "rep.0" in node.declarer.uids and manager.aside == {}
            with trio.fail_after(20):
                while me not in await hosts_of(seed.dht, "rep.0"):
                    await trio.sleep(0.05)
