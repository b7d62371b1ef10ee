"""The public relay node: a Host with the circuit relay v2 hop service and metrics.

It also answers AutoNAT dial-back requests and is a DHT bootstrap peer (a server-mode DHT node)
for each swarm it is told to serve: volunteers list relays in their swarm files, so relays are
the one set of peers every newcomer can reach.

Everything runs as a service of the relay's Host (hop, AutoNAT, metrics, one DHT per swarm): the
Host owns the tasks, and this module owns no nursery of its own.
"""

from __future__ import annotations

import socket
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

    from .healthservice import HealthService, WatchedSwarm


@dataclass
class RelayNode:
    """A running relay: its Host, hop service, and the DHT node it serves per swarm."""

    host: HostAPI
    hop: HopService
    metrics_addr: tuple[str, int] | None = None
    web_addr: tuple[str, int] | None = None  # the public health page, when served
    health: "HealthService | None" = None
    dhts: dict[str, DHTNode] = field(default_factory=dict)  # swarm id -> DHTNode


class MetricsService(BaseService):
    """Serves the relay's Prometheus metrics (hop, DHTs, process) over HTTP (``volunteer.web``:
    hypercorn's trio worker) on an already bound socket for the Host's lifetime (bound before
    anything starts: a busy port is one line)."""

    def __init__(self, hop: HopService, sock: socket.socket, dhts: dict[str, "DHTNode"]) -> None:
        from volunteer.web.serve import listener_address

        self.hop = hop
        self.sock = sock
        self.dhts = dhts  # filled as the swarms' DHT services start
        self.addr: tuple[str, int] = listener_address(sock)

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from volunteer.web.metrics import metrics_app  # imported on use: only relays started with --metrics
        from volunteer.web.serve import serve_app

        from .metrics import relay_registry

        self.host = host
        async with trio.open_nursery() as nursery:  # the server task, owned by this service's own task
            await nursery.start(serve_app, metrics_app(relay_registry(self.hop, self.dhts)), self.sock)
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
    web: tuple[str, int] | None = None,
    watched: Sequence["WatchedSwarm"] = (),
    web_refresh: float | None = None,
) -> AsyncIterator[RelayNode]:
    """Run a relay for the duration of the block. The metrics and web ports are bound first: a
    busy one is a ListenError before anything else starts. ``web``: serve the public swarm health
    page there, showing ``watched`` (default: each of ``swarms`` without grids or entry points),
    looked at again every ``web_refresh`` seconds (default ``healthservice.REFRESH_PERIOD``)."""
    config = HostConfig(announce=[Multiaddr(a) for a in announce])
    hop = HopService(limits)
    dhts: dict[str, DHTNode] = {}
    # Relays have public addresses: they answer AutoNAT dial-back requests for volunteers.
    services: list[Service] = [hop, AutoNATServer()]
    if resources is not None:  # config.toml's [limits]; else the Host's defaults
        services.append(ResourceManager(resources))
    metrics_service = None
    if metrics is not None:
        from volunteer.web.serve import open_web_socket

        metrics_service = MetricsService(hop, open_web_socket(*metrics, flag="--metrics", what="metrics"), dhts)
        services.append(metrics_service)
    health = None
    if web is not None:
        from volunteer.web.serve import open_web_socket

        from .healthservice import HealthService, WatchedSwarm

        shown = list(watched) or [WatchedSwarm(swarm_id) for swarm_id in swarms]
        try:
            web_sock = open_web_socket(*web, flag="--web", what="the health page")
        except BaseException:
            if metrics_service is not None:
                metrics_service.sock.close()
            raise
        health = HealthService(shown, dhts, hop, web_sock, **({"refresh_period": web_refresh} if web_refresh else {}))
    async with open_stack(keypair, listen, config=config, services=services) as host:
        node = RelayNode(host, hop, metrics_addr=metrics_service.addr if metrics_service is not None else None, dhts=dhts,
                         web_addr=health.addr if health is not None else None, health=health)
        # The DHTs start once the Host listens: bootstrapping identifies us to the other relays,
        # and what they learn should be our listen addresses.
        for swarm_id in swarms:
            dht_service = SwarmDHTService(swarm_id, bootstrap)
            await host.add_service(dht_service)
            assert dht_service.dht is not None  # run() set it before task_status.started()
            dhts[swarm_id] = dht_service.dht
        if health is not None:  # after the DHTs: its first refresh reads them
            await host.add_service(health)
        yield node
