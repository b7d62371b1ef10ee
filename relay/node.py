"""The public relay node: a Host with the circuit relay v2 hop service and metrics.

It also answers AutoNAT dial-back requests and is a DHT bootstrap peer (a server-mode DHT node)
for each swarm it is told to serve: volunteers list relays in their swarm files, so relays are
the one set of peers every newcomer can reach.

Everything runs as a service of the relay's Host (hop, AutoNAT, metrics, one DHT per swarm): the
Host owns the tasks, and this module owns no nursery of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from volunteer.net.config import HostConfig
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.autonat import AutoNATServer
from volunteer.net.resources import ResourceLimits, ResourceManager
from volunteer.net.service import BaseService, HostAPI, Service
from volunteer.net.stack import open_stack

from .limits import RelayLimits
from .service import HopService

if TYPE_CHECKING:
    from volunteer.dht.node import DHTNode


@dataclass
class RelayNode:
    """A running relay: its Host, hop service, and the DHT node it serves per swarm."""

    host: HostAPI
    hop: HopService
    metrics_addr: tuple[str, int] | None = None
    dhts: dict[str, DHTNode] = field(default_factory=dict)  # swarm id -> DHTNode


class MetricsService(BaseService):
    """Serves the relay's Prometheus metrics (hop, DHTs, process) over HTTP on an already bound
    listener for the Host's lifetime (bound before anything starts: a busy port is one line)."""

    def __init__(self, hop: HopService, listener: trio.SocketListener, dhts: dict[str, "DHTNode"]) -> None:
        from volunteer.metrics_http import listener_address

        self.hop = hop
        self.listener = listener
        self.dhts = dhts  # filled as the swarms' DHT services start
        self.addr: tuple[str, int] = listener_address(listener)

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from volunteer.metrics_http import serve_registry  # imported on use: only relays started with --metrics

        from .metrics import relay_registry

        self.host = host
        async with trio.open_nursery() as nursery:  # the server task, owned by this service's own task
            await nursery.start(serve_registry, self.listener, relay_registry(self.hop, self.dhts))
            task_status.started()


class SwarmDHTService(BaseService):
    """A server-mode DHT node for one swarm, bootstrapping from ``bootstrap`` (other relays of
    the swarm, so there is one DHT) in the background, for the Host's lifetime."""

    def __init__(self, swarm_id: str, bootstrap: Sequence[str | Multiaddr] = ()) -> None:
        self.swarm_id = swarm_id
        self.bootstrap = list(bootstrap)
        self.dht: DHTNode | None = None  # once running

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from volunteer.dht import DHTConfig  # imported on use, as before: `import relay` stays light
        from volunteer.dht.node import open_dht

        self.host = host
        async with open_dht(host, DHTConfig(swarm_id=self.swarm_id), bootstrap=self.bootstrap, wait_bootstrap=False) as dht:
            self.dht = dht
            if self.bootstrap:
                host.start_soon(dht.bootstrap)
            task_status.started()
            await trio.sleep_forever()


@asynccontextmanager
async def open_relay_node(
    keypair: KeyPair,
    listen: Sequence[str | Multiaddr],
    announce: Sequence[str | Multiaddr] = (),
    limits: RelayLimits | None = None,
    metrics: tuple[str, int] | None = None,
    swarms: Sequence[str] = ("default",),
    bootstrap: Sequence[str | Multiaddr] = (),
    resources: ResourceLimits | None = None,
) -> AsyncIterator[RelayNode]:
    """Run a relay for the duration of the block. The metrics port is bound first: a busy one is
    a ListenError before anything else starts."""
    config = HostConfig(announce=[Multiaddr(a) for a in announce])
    hop = HopService(limits)
    dhts: dict[str, DHTNode] = {}
    # Relays have public addresses: they answer AutoNAT dial-back requests for volunteers.
    services: list[Service] = [hop, AutoNATServer()]
    if resources is not None:  # config.toml's [limits]; else the Host's defaults
        services.append(ResourceManager(resources))
    metrics_service = None
    if metrics is not None:
        from volunteer.metrics_http import open_metrics_listener

        metrics_service = MetricsService(hop, await open_metrics_listener(*metrics), dhts)
        services.append(metrics_service)
    async with open_stack(keypair, listen, config=config, services=services) as host:
        node = RelayNode(host, hop, metrics_addr=metrics_service.addr if metrics_service is not None else None, dhts=dhts)
        # The DHTs start once the Host listens: bootstrapping identifies us to the other relays,
        # and what they learn should be our listen addresses.
        for swarm_id in swarms:
            dht_service = SwarmDHTService(swarm_id, bootstrap)
            await host.add_service(dht_service)
            assert dht_service.dht is not None  # run() set it before task_status.started()
            dhts[swarm_id] = dht_service.dht
        yield node
