"""The AddressObserver service: collects identify's observed addresses and tells the Host's bus.

The one place that turns ``PeerIdentified`` events into ``ObservedAddrs`` observations (pure,
``nat/observed.py``) and publishes ``ObservedAddrChanged`` when the set of our observed external
addresses changes. The hole puncher and the NAT manager read it through ``host.service``.
"""

from __future__ import annotations

import trio

from .. import limits
from ..events import ObservedAddrChanged, PeerIdentified
from ..multiaddr import Multiaddr
from ..service import BaseService, HostAPI
from .observed import MappingType, ObservedAddrs


class AddressObserver(BaseService):
    """Keeps what peers tell us about our address; publishes ObservedAddrChanged on a change."""

    def __init__(self) -> None:
        self.observed = ObservedAddrs()
        self._published: tuple[Multiaddr, ...] = ()

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

    def external_addrs(self, now: float) -> list[Multiaddr]:
        """Observed external addresses of our listen ports: what a hole punch asks the peer to dial."""
        return self.observed.external_addrs(now, self.host.listen_addrs)

    def mapping(self, now: float) -> MappingType:
        """The NAT mapping type of our (first) TCP listen port."""
        ports = [int(port) for a in self.host.listen_addrs if (port := a.value_for("tcp"))]
        return self.observed.mapping(now, ports[0] if ports else None)


__all__ = ["AddressObserver"]
