"""A simulated swarm of 200 DHT nodes on the in-memory transport under trio's MockClock.

Every node is a real Host (Noise, yamux, identify) and a real DHT driver; only the network is
in memory and time is virtual (autojump), so timeouts, expirations and heartbeats run in
seconds of wall time. Checks the issue's acceptance bounds: lookups succeed with 20% of nodes
crashed, declared experts are found within one update period, crashed hosts' experts vanish
within one expiration, and a malicious node cannot overwrite or delete others' records.
"""

from __future__ import annotations

import functools
import random

import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.beam import find_best_experts
from volunteer.dht.grid import get_experts
from volunteer.dht.node import open_dht
from volunteer.dht.records import Record, sign, signing_payload
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

N = 200
CONFIG = DHTConfig(swarm_id="sim", expert_update_period=5.0, expert_expiration=15.0)
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


class Sim:
    def __init__(self, nursery: trio.Nursery, seed: int = 7) -> None:
        self.network = MemoryNetwork()
        self.nursery = nursery
        self.nodes = []  # DHTNode
        self.scopes = []  # one CancelScope per node: cancelling it is a crash
        self.side_tasks: dict[int, list[trio.CancelScope]] = {}
        self.rng = random.Random(seed)

    async def spawn(self) -> None:
        boot = [n.host.full_addrs()[0] for n in self.rng.sample(self.nodes, min(2, len(self.nodes)))]

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as scope:
                async with open_stack(listen=["/memory/0"], transports=[MemoryTransport(self.network)], options=QUIET) as host:
                    async with open_dht(host, CONFIG, bootstrap=boot, clock=trio.current_time) as dht:
                        task_status.started((dht, scope))
                        await trio.sleep_forever()

        dht, scope = await self.nursery.start(run)
        self.nodes.append(dht)
        self.scopes.append(scope)

    def crash(self, index: int) -> None:
        self.scopes[index].cancel()
        for scope in self.side_tasks.pop(index, []):
            scope.cancel()  # what ran in the crashed process dies with it

    def start_on(self, index: int, async_fn) -> None:
        """Run ``async_fn`` as part of node ``index``: a crash of the node stops it too."""
        scope = trio.CancelScope()
        self.side_tasks.setdefault(index, []).append(scope)

        async def run():
            with scope:
                await async_fn()

        self.nursery.start_soon(run)

    def alive(self) -> list[int]:
        return [i for i, s in enumerate(self.scopes) if not s.cancel_called]


@pytest.mark.heavy
@pytest.mark.trio_timeout(600)
async def test_two_hundred_nodes(autojump_clock):
    async with trio.open_nursery() as nursery:
        sim = Sim(nursery)
        for _ in range(N):
            await sim.spawn()
        await trio.sleep(5)
        tables = [len(n.state.table) for n in sim.nodes]
        assert min(tables) >= 10, f"a node joined with a nearly empty table: {sorted(tables)[:5]}"

        # --- store 60 keys from random publishers, then crash 20% of the nodes --------------------
        rng = sim.rng
        keys = [f"key-{i}".encode() for i in range(60)]
        publishers = {}
        for key in keys:
            publisher = rng.randrange(N)
            publishers[key] = publisher
            copies = await sim.nodes[publisher].store(key, b"value of " + key, trio.current_time() + 3000)
            assert copies >= CONFIG.store_replicas
        crashed = rng.sample(range(N), N // 5)
        for index in crashed:
            sim.crash(index)
        await trio.sleep(1)
        alive = sim.alive()
        ok = 0
        attempts = 0
        for key in keys:
            for asker in rng.sample(alive, 3):
                attempts += 1
                records = await sim.nodes[asker].get(key)
                ok += any(r.value == b"value of " + key for r in records.values())
        assert ok / attempts >= 0.99, f"only {ok}/{attempts} lookups succeeded with 20% crashed"

        # --- experts: 20 hosts declare; trainers find them within one update period ----------------
        hosts = rng.sample(alive, 20)
        declarers = {}
        started = trio.current_time()
        for n, index in enumerate(hosts):
            declarer = ExpertDeclarer(sim.nodes[index], [f"ffn.{n}.{j}" for j in range(4)])
            declarers[index] = declarer
            sim.start_on(index, functools.partial(declarer.run, declarer.host))
        await trio.sleep(CONFIG.expert_update_period)
        trainer = sim.nodes[rng.choice([i for i in alive if i not in hosts])]
        found = await get_experts(trainer, [f"ffn.{n}.{j}" for n in range(20) for j in range(4)])
        missing = [uid for uid, decls in found.items() if not decls]
        assert not missing, f"not found {trio.current_time() - started:.1f} s after declaring: {missing[:5]}"
        best = await find_best_experts(trainer, "ffn", [[float(i) for i in range(20)], [0, 0, 0, 10.0]], beam_size=4)
        assert [m.uid for m in best] == ["ffn.19.3", "ffn.18.3", "ffn.17.3", "ffn.16.3"]

        # --- crash 5 declaring hosts: their experts vanish within one expiration -------------------
        gone = hosts[:5]
        for index in gone:
            declarers[index].withdraw = _crashed  # a crash publishes no tombstones
            sim.crash(index)
        await trio.sleep(CONFIG.expert_expiration + 0.5)
        found = await get_experts(trainer, [f"ffn.{n}.0" for n in range(20)])
        for n, index in enumerate(hosts):
            assert bool(found[f"ffn.{n}.0"]) == (index not in gone), f"ffn.{n}.0 (host crashed: {index in gone})"

        # --- a malicious node cannot overwrite or delete others' records --------------------------
        evil = sim.nodes[rng.choice(sim.alive())]
        victim_key = next(k for k in keys if publishers[k] in sim.alive())
        victim = sim.nodes[publishers[victim_key]]
        victim_sub = victim.host.peer_id.to_bytes()
        far = trio.current_time() + 3500
        forged_value = Record(victim_key, victim_sub, b"evil", far, victim.host.peer_id, b"\x00" * 64)
        resigned = Record(
            victim_key, victim_sub, b"evil", far, evil.host.peer_id,
            evil.host.keypair.sign(signing_payload(victim_key, victim_sub, b"evil", far)),
        )
        tombstone = Record(
            victim_key, victim_sub, None, far, evil.host.peer_id,
            evil.host.keypair.sign(signing_payload(victim_key, victim_sub, None, far)),
        )
        holders = await evil.find_closest(victim_key)
        refused = 0
        for contact in holders:
            try:
                response = await evil.request(contact, evil.state.store_request([forged_value, resigned, tombstone]))
            except Exception:
                continue
            refused += sum(code not in ("ok", "stale") for code in response.codes)
        assert refused >= 3 * (len(holders) // 2)
        for asker in rng.sample(sim.alive(), 5):
            records = await sim.nodes[asker].get(victim_key)
            assert [r.value for r in records.values()] == [b"value of " + victim_key]
        nursery.cancel_scope.cancel()


async def _crashed() -> int:
    return 0
