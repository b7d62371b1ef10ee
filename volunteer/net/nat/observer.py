"""The AddressObserver service: collects identify's observed addresses and tells the Host's bus.

The one place that turns ``PeerIdentified`` events into ``ObservedAddrs`` observations (pure,
``nat/observed.py``) and publishes ``ObservedAddrChanged`` when the set of our observed external
addresses changes. The hole puncher and the NAT manager read it through ``host.service``.

Observations are per transport: a TCP connection says nothing about the port our NAT maps for
QUIC. When we listen on a transport nobody has reported yet, and a peer we reached directly
(a relay, typically) advertises that transport at the same IP, the observer dials it there once
from our listen socket, so identify on that connection tells us our address for it too.
"""

from __future__ import annotations

import logging

import trio

from ...errors import VolunteerError, describe
from .. import limits
from ..events import ObservedAddrChanged, PeerIdentified
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..service import BaseService, HostAPI
from .observed import MappingType, ObservedAddrs, probe_target

log = logging.getLogger(__name__)


class AddressObserver(BaseService):
    """Keeps what peers tell us about our address; publishes ObservedAddrChanged on a change."""

    def __init__(self) -> None:
        self.observed = ObservedAddrs()
        self._published: tuple[Multiaddr, ...] = ()
        self._probed: dict[tuple[PeerID, str], float] = {}  # (peer, transport) -> when we last dialled it

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        # One identify per connection: a queue as long as the connection limit loses none.
        with host.events.subscribe(PeerIdentified, max_queued=limits.MAX_CONNECTIONS) as events:
            task_status.started()
            async for event in events:
                assert isinstance(event, PeerIdentified)
                self.note(event, now=trio.current_time())

    def note(self, event: PeerIdentified, *, now: float) -> None:
        """Record the observation ``event`` carries, if any, and publish a change of our addresses."""
        info = event.info
        if info is None or info.observed_addr is None:
            return
        conn = event.connection
        self.observed.record(event.peer, conn.remote_addr, conn.local_addr, info.observed_addr, now)
        current = tuple(self.observed.candidates(now, None, limit=limits.MAX_OBSERVATIONS))
        if set(current) != set(self._published):
            self._published = current
            self.host.events.publish(ObservedAddrChanged(current))
        if not conn.remote_addr.is_relayed():
            for transport in self.observed.missing(now, self.host.listen_addrs):
                self._maybe_probe(event.peer, info.listen_addrs, conn.remote_addr, transport, now)

    def _maybe_probe(self, peer: PeerID, peer_addrs: list[Multiaddr], remote: Multiaddr, transport: str, now: float) -> None:
        target = probe_target(peer_addrs, remote, transport)
        last = self._probed.get((peer, transport))
        if target is None or (last is not None and now - last < limits.OBSERVATION_TTL):
            return
        if len(self._probed) >= limits.MAX_OBSERVATIONS:
            self._probed.pop(next(iter(self._probed)))
        self._probed[(peer, transport)] = now
        self.host.start_soon(self._probe, peer, target, name=f"observe {transport} via {peer.short()}")

    async def _probe(self, peer: PeerID, target: Multiaddr) -> None:
        """Dial ``peer`` at ``target`` from our listen socket; identify on the new connection
        reports our address there (and the connection keeps that NAT mapping alive)."""
        try:
            await self.host.dial_addr(target, peer)
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.debug("observation dial to %s at %s failed: %s", peer.short(), target, describe(exc))

    def external_addrs(self, now: float) -> list[Multiaddr]:
        """Observed external addresses of our listen ports: what a hole punch asks the peer to dial."""
        return self.observed.external_addrs(now, self.host.listen_addrs)

    def mapping(self, now: float) -> MappingType:
        """The NAT mapping type of our (first) TCP listen port."""
        ports = [int(port) for a in self.host.listen_addrs if (port := a.value_for("tcp"))]
        return self.observed.mapping(now, ports[0] if ports else None)


__all__ = ["AddressObserver"]
