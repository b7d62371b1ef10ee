"""A volunteer (Host + DHT + runtime + expert server + declarer) in its own background event
loop, for tests that drive trainers from plain synchronous code as users do."""

from __future__ import annotations

import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.node import open_dht
from volunteer.experts import ExpertsConfig, make_backend, open_runtime
from volunteer.experts.loop import BackgroundLoop
from volunteer.experts.server import ExpertServer
from volunteer.net.host import HostConfig, open_host
from volunteer.net.multiaddr import Multiaddr
from volunteer.swarmfile import SwarmSpec

QUIET = HostConfig(enable_hole_punching=False, enable_relay_client=False, enable_perf=False)
SWARM = "testswarm"
DHT_CONFIG = DHTConfig(swarm_id=SWARM, expert_update_period=1.0, expert_expiration=3.0)


class Volunteer:
    def __init__(self, uids, *, hidden: int = 8, expert_class: str = "ffn", bootstrap=(), config: ExpertsConfig | None = None,
                 backends=None) -> None:
        self.uids, self.hidden, self.expert_class = list(uids), hidden, expert_class
        self.bootstrap = list(bootstrap)
        self.config = config or ExpertsConfig(device="cpu")
        self.backends = backends
        self.loop = BackgroundLoop().start()
        self.loop.run(self._start, timeout=30)

    async def _start(self) -> None:
        self._ready, self._stop, self._done = trio.Event(), trio.Event(), trio.Event()
        self._crash = False
        trio.lowlevel.spawn_system_task(self._main)
        await self._ready.wait()

    async def _main(self) -> None:
        try:
            async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], config=QUIET) as host:
                self.host = host
                async with open_dht(host, DHT_CONFIG, bootstrap=self.bootstrap) as dht:
                    self.dht = dht
                    backends = self.backends or [
                        make_backend(uid, self.expert_class, self.hidden, config=self.config) for uid in self.uids
                    ]
                    async with open_runtime(backends, self.config) as runtime:
                        self.runtime = runtime
                        self.server = ExpertServer(host, runtime, SWARM, self.config)
                        self.server.install()
                        self.declarer = ExpertDeclarer(dht, runtime.uids)
                        async with trio.open_nursery() as nursery:
                            await nursery.start(self.declarer.run)
                            await self.declarer.declare_once()
                            self._ready.set()
                            await self._stop.wait()
                            if self._crash:
                                self.declarer.withdraw = _nothing
                            nursery.cancel_scope.cancel()
        finally:
            self._ready.set()
            self._done.set()

    @property
    def addr(self) -> Multiaddr:
        return self.host.full_addrs()[0]

    def spec(self) -> SwarmSpec:
        return SwarmSpec(SWARM, SWARM, [self.addr], [])

    def stop(self, *, crash: bool = False) -> None:
        async def stop() -> None:
            self._crash = crash
            self._stop.set()
            await self._done.wait()

        if self.loop.running:
            self.loop.run(stop, timeout=30)
            self.loop.stop()


async def _nothing() -> int:
    return 0
