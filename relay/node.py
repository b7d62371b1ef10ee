"""The public relay node: a Host with the circuit relay v2 hop service and metrics.

It also answers AutoNAT dial-back requests; the DHT bootstrap role plugs in through
``RelayNode.nursery`` once the DHT exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from volunteer.net.host import HostConfig, open_host
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.nat.autonat import AutoNATServer

from .limits import RelayLimits
from .service import HopService


@dataclass
class RelayNode:
    host: object
    hop: HopService
    nursery: trio.Nursery
    metrics_addr: tuple[str, int] | None = None


@asynccontextmanager
async def open_relay_node(
    keypair: KeyPair,
    listen: Sequence[str | Multiaddr],
    announce: Sequence[str | Multiaddr] = (),
    limits: RelayLimits | None = None,
    metrics: tuple[str, int] | None = None,
):
    """Run a relay for the duration of the block."""
    config = HostConfig(announce=[Multiaddr(a) for a in announce])
    async with open_host(keypair, listen, config=config) as host, trio.open_nursery() as nursery:
        hop = HopService(host, limits)
        await nursery.start(hop.run)
        # Relays have public addresses: they answer AutoNAT dial-back requests for volunteers.
        AutoNATServer(host).install()
        node = RelayNode(host, hop, nursery)
        if metrics is not None:
            from .metrics import serve_metrics

            node.metrics_addr = await nursery.start(serve_metrics, hop, metrics[0], metrics[1])
        try:
            yield node
        finally:
            nursery.cancel_scope.cancel()
