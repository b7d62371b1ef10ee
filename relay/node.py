"""The public relay node: a Host with the circuit relay v2 hop service and metrics.

It also answers AutoNAT dial-back requests and is a DHT bootstrap peer (a server-mode DHT node)
for each swarm it is told to serve: volunteers list relays in their swarm files, so relays are
the one set of peers every newcomer can reach.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from volunteer.net.host import HostConfig, open_host
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.autonat import AutoNATServer
from volunteer.net.service import HostAPI

from .limits import RelayLimits
from .service import HopService


@dataclass
class RelayNode:
    """A running relay: its Host, hop service, and the DHT node it serves per swarm."""

    host: HostAPI
    hop: HopService
    nursery: trio.Nursery
    metrics_addr: tuple[str, int] | None = None
    dhts: dict = field(default_factory=dict)  # swarm id -> DHTNode


@asynccontextmanager
async def open_relay_node(
    keypair: KeyPair,
    listen: Sequence[str | Multiaddr],
    announce: Sequence[str | Multiaddr] = (),
    limits: RelayLimits | None = None,
    metrics: tuple[str, int] | None = None,
    swarms: Sequence[str] = ("default",),
    bootstrap: Sequence[str | Multiaddr] = (),
):
    """Run a relay for the duration of the block. The metrics port is bound first: a busy one is
    a ListenError before anything else starts."""
    config = HostConfig(announce=[Multiaddr(a) for a in announce])
    metrics_listener = None
    if metrics is not None:
        from volunteer.metrics_http import open_metrics_listener

        metrics_listener = await open_metrics_listener(*metrics)
    async with open_host(keypair, listen, config=config) as host, trio.open_nursery() as nursery:
        hop = HopService(host, limits)
        await nursery.start(hop.run)
        # Relays have public addresses: they answer AutoNAT dial-back requests for volunteers.
        await host.add_service(AutoNATServer())
        node = RelayNode(host, hop, nursery)
        for swarm_id in swarms:
            node.dhts[swarm_id] = await nursery.start(_serve_dht, host, swarm_id, list(bootstrap))
        if metrics_listener is not None:
            from volunteer.metrics_http import listener_address, serve_registry

            from .metrics import relay_registry

            node.metrics_addr = listener_address(metrics_listener)
            await nursery.start(serve_registry, metrics_listener, relay_registry(hop, node.dhts))
        try:
            yield node
        finally:
            nursery.cancel_scope.cancel()


async def _serve_dht(host: HostAPI, swarm_id: str, bootstrap: list, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    from volunteer.dht import DHTConfig
    from volunteer.dht.node import open_dht

    # other relays of the swarm, if given: relays bootstrap from each other so there is one DHT
    async with open_dht(host, DHTConfig(swarm_id=swarm_id), bootstrap=bootstrap, wait_bootstrap=False) as dht:
        if bootstrap:
            host.start_soon(dht.bootstrap)
        task_status.started(dht)
        await trio.sleep_forever()
