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
from ..transport.quic import QuicTransport
from .birthday import udp_role
from .observed import MappingType, ObservedAddrs, endpoint_of, probe_target

log = logging.getLogger(__name__)


class AddressObserver(BaseService):
    """Keeps what peers tell us about our address; publishes ObservedAddrChanged on a change."""

    def __init__(self) -> None:
        self.observed = ObservedAddrs()
        self._published: tuple[Multiaddr, ...] = ()
        self._probed: dict[tuple[PeerID, str], float] = {}  # (peer, transport) -> when we last dialled it
        # transport -> each observation dial in flight: when its grace ends, and the IP it dials
        self._probing: dict[str, list[tuple[float, str]]] = {}
        self._identified: set[int] = set()  # ids of connections identify has told us about
        self._moved = trio.Event()  # set (and replaced) whenever an observation may have come or gone
        self._nursery: trio.Nursery | None = None

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        # One identify per connection: a queue as long as the connection limit loses none.
        with host.events.subscribe(PeerIdentified, max_queued=limits.MAX_CONNECTIONS) as events:
            # our own nursery for the observation dials: they end with us, never racing the Host's close
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                async for event in events:
                    assert isinstance(event, PeerIdentified)
                    self._identified.add(event.connection.id)
                    self.note(event, now=trio.current_time())
                    self._touch()
                nursery.cancel_scope.cancel()

    def _touch(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    def moved(self) -> trio.Event:
        """An event set when a peer next identifies itself or an observation dial ends
        (``awaiting`` may change): take it before looking, then wait on it."""
        return self._moved

    def awaiting(self, transport: str, now: float) -> bool:
        """Whether an observation of our address over ``transport`` can still arrive soon: an
        observation dial over it is in flight, within its grace (``_grace``) or past it but
        hearing from its peer (a loaded machine's handshake is slow, not lost), or a direct
        connection has not been identified yet (over ``transport`` its identify says our
        address; over another, it may start an observation dial for ``transport``). When neither
        (an office that drops UDP: its QUIC dial hears nothing until its timeout), waiting for
        one is waiting for nothing."""
        for grace_ends, target in self._probing.get(transport, ()):
            if now < grace_ends or (transport == "quic" and self._answering(target)):
                return True
        live = [conn for conn in self.host.connections() if not conn.is_closed]
        self._identified &= {conn.id for conn in live}  # bounded by the connections we hold
        # per connection, not per peer: an observation dial reaches a peer identified already
        return any(not conn.remote_addr.is_relayed() and conn.id not in self._identified for conn in live)

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
                self._maybe_probe(event.peer, info.listen_addrs, conn.remote_addr, transport, now, _grace(now - conn.opened_at))

    def _answering(self, ip: str) -> bool:
        quic = self.host.service(QuicTransport)
        return quic is not None and quic.answering(ip)

    def _maybe_probe(self, peer: PeerID, peer_addrs: list[Multiaddr], remote: Multiaddr, transport: str,
                     now: float, grace: float) -> None:
        target = probe_target(peer_addrs, remote, transport)
        last = self._probed.get((peer, transport))
        if target is None or (last is not None and now - last < limits.OBSERVATION_TTL):
            return
        if len(self._probed) >= limits.MAX_OBSERVATIONS:
            self._probed.pop(next(iter(self._probed)))
        self._probed[(peer, transport)] = now
        if self._nursery is not None:
            # counted from now, not from when the task first runs: a punch asking ``awaiting``
            # in between must see it coming
            found = endpoint_of(target)
            entry = (now + grace, found[1] if found is not None else "")
            self._probing.setdefault(transport, []).append(entry)
            self._nursery.start_soon(self._probe, peer, target, transport, entry,
                                     name=f"observe {transport} via {peer.short()}")
            self._nursery.start_soon(self._touch_at, entry[0])

    async def _probe(self, peer: PeerID, target: Multiaddr, transport: str, entry: tuple[float, str]) -> None:
        """Dial ``peer`` at ``target`` from our listen socket; identify on the new connection
        reports our address there (and the connection keeps that NAT mapping alive)."""
        try:
            await self.host.dial_addr(target, peer)
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.debug("observation dial to %s at %s failed: %s", peer.short(), target, describe(exc))
        finally:
            self._probing[transport].remove(entry)
            self._touch()

    async def _touch_at(self, when: float) -> None:
        """Wake whoever waits on ``awaiting`` when a dial's grace ends (the dial itself goes on)."""
        await trio.sleep_until(when)
        self._touch()

    def external_addrs(self, now: float) -> list[Multiaddr]:
        """Observed external addresses of our listen ports: what a hole punch asks the peer to dial."""
        return self.observed.external_addrs(now, self.host.listen_addrs)

    def udp_role(self, now: float) -> str | None:
        """Our side of a birthday probe (``birthday.udp_role``): from the mapping peers observed for
        our IPv4 QUIC listen port."""
        ports = [found[2] for found in map(endpoint_of, self.host.listen_addrs)
                 if found is not None and found[0] == "quic" and ":" not in found[1]]
        local = ports[0] if ports else None
        if local is None:
            return None
        observed = [found[2] for found in map(endpoint_of, self.observed.candidates(now, local, transport="quic"))
                    if found is not None and ":" not in found[1]]
        return udp_role(self.observed.mapping(now, local, transport="quic"), observed, local)

    def mapping(self, now: float) -> MappingType:
        """The NAT mapping type of our (first) TCP listen port."""
        ports = [int(port) for a in self.host.listen_addrs if (port := a.value_for("tcp"))]
        return self.observed.mapping(now, ports[0] if ports else None)


def _grace(identify_took: float) -> float:
    """How long a punch waits for an observation dial that has heard nothing from its peer: a
    QUIC handshake to a peer that has just identified over TCP takes a round trip or two, and a
    machine slow at the one is slow at the other, so the grace scales with how long that identify
    took (from its connection's opening), within a floor and the punch's whole observation wait.
    An office that drops UDP hears nothing from its dial for as long as the dial lasts: past the
    grace, a punch goes on with the addresses it has."""
    return min(limits.DCUTR_OBSERVATION_WAIT,
               max(limits.OBSERVATION_DIAL_GRACE, limits.OBSERVATION_DIAL_GRACE_FACTOR * max(0.0, identify_took)))


__all__ = ["AddressObserver"]
