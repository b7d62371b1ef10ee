"""A volunteer (``open_volunteer``: Host + DHT + runtime + expert server + declarer) in its own
background event loop, for tests that drive trainers from plain synchronous code as users do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
SWARM = "testswarm"
DHT_CONFIG = DHTConfig(swarm_id=SWARM, expert_update_period=1.0, expert_expiration=3.0)


class Volunteer:
    """A volunteer node on loopback serving ``uids`` (or ready-made ``backends``) until ``stop``;
    ``kind="hivemind"``: a member of a hivemind swarm (hivemind's DHT and expert RPCs)."""

    def __init__(self, uids, *, hidden: int = 8, expert_class: str = "ffn", bootstrap=(), config: ExpertsConfig | None = None,
                 backends=None, kind: str = "volunteer") -> None:
        self.kind = kind
        self.options = VolunteerOptions(
            listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT_CONFIG, nat=False, mdns=False,
            expert_class=expert_class, uids=list(uids), hidden_dim=hidden,
            experts_config=config or ExpertsConfig(device="cpu"), backends=backends,
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
        spec = SwarmSpec(SWARM, SWARM, self.bootstrap, [], kind=self.kind)
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
        return SwarmSpec(SWARM, SWARM, [self.addr], [], kind=self.kind)

    def stop(self, *, crash: bool = False) -> None:
        async def stop() -> None:
            self._crash = crash
            self._stop.set()
            await self._done.wait()

        if self.loop.running:
            self.loop.run(stop, timeout=30)
            self.loop.stop()


@contextlib.contextmanager
def volunteer_and_trainer(uids, *, hidden: int = 8) -> Iterator[tuple[Volunteer, Swarm]]:
    """A volunteer serving ``uids`` and a trainer's ``Swarm`` joined through it; both stop after."""
    volunteer = Volunteer(uids, hidden=hidden)
    swarm = Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG)
    try:
        yield volunteer, swarm
    finally:
        swarm.close()
        volunteer.stop()


async def _nothing() -> int:
    return 0
