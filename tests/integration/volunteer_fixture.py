"""A volunteer (``open_volunteer``: Host + DHT + runtime + expert server + declarer) in its own
background event loop, for tests that drive trainers from plain synchronous code as users do."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import trio

from volunteer.dht import DHTConfig
from volunteer.experts import ExpertsConfig
from volunteer.experts.loop import BackgroundLoop
from volunteer.hivemind.experts import HivemindExperts
from volunteer.net.stack import StackOptions
from volunteer.net.multiaddr import Multiaddr
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarm import Swarm
from volunteer.swarmfile import SwarmSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # lying_volunteer: liars for the tests

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
SWARM = "testswarm"
DHT_CONFIG = DHTConfig(swarm_id=SWARM, expert_update_period=1.0, expert_expiration=3.0)


class Volunteer:
    """A volunteer node on loopback serving ``uids`` (or ready-made ``backends``) until ``stop``;
    ``kind="hivemind"``: a member of a hivemind swarm (hivemind's DHT and expert RPCs)."""

    def __init__(self, uids, *, hidden: int = 8, expert_class: str = "ffn", bootstrap=(), config: ExpertsConfig | None = None,
                 backends=None, kind: str = "volunteer", grid=None, replicas_config=None,
                 dht_config: DHTConfig = DHT_CONFIG, trainers: str | list = "open", receipts: bool = False) -> None:
        self.kind = kind
        self.receipts = receipts  # the swarm file's receipts: exact audits
        self.trainers = trainers  # the swarm file's trainers: "open" or the listed peer IDs
        self.grids = [grid] if grid is not None else []  # a swarm file's [[grid]]: placed, caught up, synced
        self.options = VolunteerOptions(
            listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=dht_config, nat=False, mdns=False,
            expert_class=expert_class, uids=list(uids), hidden_dim=hidden,
            experts_config=config or ExpertsConfig(device="cpu"), backends=backends,
            place=grid is not None and not uids, max_experts=len(list(grid.uids())) if grid is not None else None,
            replicas_config=replicas_config,
        )
        self.bootstrap = list(bootstrap)
        self.loop = BackgroundLoop().start()
        self.loop.run(self._start, timeout=30)

    async def _start(self) -> None:
        self._ready, self._stop, self._done = trio.Event(), trio.Event(), trio.Event()
        self._crash = False
        trio.lowlevel.spawn_system_task(self._main)
        await self._ready.wait()

    async def _main(self) -> None:
        spec = SwarmSpec(SWARM, SWARM, self.bootstrap, [], kind=self.kind, grids=self.grids, trainers=self.trainers,
                         receipts=self.receipts)
        try:
            with trio.CancelScope() as scope:
                async with open_volunteer(spec, self.options) as node:
                    self.node = node
                    self.host, self.dht, self.runtime = node.host, node.dht, node.runtime
                    self.server, self.declarer = node.server, node.declarer
                    # trainers find us as soon as we are ready
                    hivemind_experts = node.host.service(HivemindExperts)
                    if hivemind_experts is not None:
                        await hivemind_experts.declare()
                    else:
                        await node.declarer.declare_once()
                    self._ready.set()
                    await self._stop.wait()
                    if self._crash:  # vanish without tombstones, as a killed process would
                        node.declarer.withdraw = _nothing
                        scope.cancel()
        finally:
            self._ready.set()
            self._done.set()

    @property
    def addr(self) -> Multiaddr:
        return self.host.full_addrs()[0]

    def spec(self) -> SwarmSpec:
        return SwarmSpec(SWARM, SWARM, [self.addr], [], kind=self.kind, grids=self.grids, receipts=self.receipts)

    @property
    def peer(self) -> str:
        return str(self.host.peer_id)

    def lie(self, lie) -> None:
        """From now on every expert here returns ``lie(honest output)`` (its state stays honest)."""
        from lying_volunteer import lie_in_module

        self.corrupt(lambda module: lie_in_module(module, lie))

    def corrupt(self, patch) -> None:
        """Apply ``patch(module)`` to every expert's module here, between batches."""
        async def apply() -> None:
            await self.runtime.run_sync(lambda: [patch(b.module) for b in self.runtime.backends.values()])

        self.loop.run(apply)

    def claim_no_sync(self) -> None:
        """From now on this volunteer declares no sync age for any expert (a modified install's
        claim: its rounds still run), starting with a declaration right now."""
        async def apply() -> None:
            self.declarer.synced_ages = lambda uid: None
            await self.declarer.declare_once()

        self.loop.run(apply)

    def stop(self, *, crash: bool = False) -> None:
        async def stop() -> None:
            self._crash = crash
            self._stop.set()
            await self._done.wait()

        if self.loop.running:
            self.loop.run(stop, timeout=30)
            self.loop.stop()


@contextlib.contextmanager
def volunteer_and_trainer(uids, *, hidden: int = 8, receipts: bool = False) -> Iterator[tuple[Volunteer, Swarm]]:
    """A volunteer serving ``uids`` and a trainer's ``Swarm`` joined through it; both stop after."""
    volunteer = Volunteer(uids, hidden=hidden, receipts=receipts)
    swarm = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    try:
        yield volunteer, swarm
    finally:
        swarm.close()
        volunteer.stop()


async def _nothing() -> int:
    return 0
