"""``LanDiscovery``: volunteers of one swarm on one LAN find each other with no configuration.

A Host service around ``mdns.MdnsDiscovery``: it announces the Host's direct addresses (those of
its interfaces, LAN ones included; never loopback or link-local) and hands
every peer it finds to the DHT node, which pings it; those that speak the swarm's DHT join the
routing table. A machine without a multicast-capable interface logs one warning and goes on (the
swarm's bootstrap peers still work).
"""

from __future__ import annotations

import logging

import trio

from ..errors import VolunteerError, describe
from .status import LanStatus
from ..net.addresses import for_peer
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, HostAPI
from .node import DHTNode

log = logging.getLogger(__name__)


class LanDiscovery(BaseService):
    """Finds volunteers on the LAN by mDNS and offers them to ``dht`` (``DHTNode.add_peer``)."""

    def __init__(self, dht: DHTNode) -> None:
        self.dht = dht
        self.host = dht.host
        self.found = 0  # peers mDNS reported (each offered to the DHT)

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from .mdns import MdnsDiscovery  # zeroconf loads only on nodes that look for LAN peers

        task_status.started()  # discovery is a bonus: the node does not wait for zeroconf
        async with trio.open_nursery() as nursery:

            def found(peer: str, addrs: list[str]) -> None:
                try:
                    # a LAN peer's loopback or link-local address would reach ourselves, or nothing
                    parsed = for_peer([Multiaddr(a) for a in addrs], None)
                    nursery.start_soon(self.dht.add_peer, PeerID.from_string(peer), parsed)
                    self.found += 1
                except VolunteerError as exc:
                    log.debug("mDNS: ignoring %s: %s", peer, describe(exc))

            def ours() -> list[str]:
                # our LAN (and public) addresses from the interfaces; never loopback or link-local
                return [str(a.with_peer_id(host.peer_id)) for a in host.addrs_for(None) if not a.is_relayed()]

            discovery = MdnsDiscovery(str(host.peer_id), ours, found)
            try:
                await discovery.run()
            except OSError as exc:  # no multicast-capable interface
                log.warning("LAN discovery (mDNS) is off: %s", exc)

    def snapshot(self) -> LanStatus:
        """How many LAN peers mDNS found."""
        return {"found": self.found}


__all__ = ["LanDiscovery"]
