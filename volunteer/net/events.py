"""Host events: what services, the DHT and the TUI learn about instead of polling.

Subscribers get a bounded channel; a subscriber that does not keep up loses events (counted in
``dropped``) rather than blocking the network code that publishes them. A subscription may name
the event types it wants (``host.events.subscribe(DirectConnectionUp)``); use it as a context
manager so it is dropped when the subscriber is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from .connection import Connection
    from .identity import PeerID
    from .multiaddr import Multiaddr

MAX_QUEUED_EVENTS = 256


@dataclass(frozen=True)
class HostEvent:
    """Base class of everything published on a Host's bus."""


@dataclass(frozen=True)
class ConnectionEvent(HostEvent):
    """An event about one connection to ``peer``."""

    peer: "PeerID"
    connection: "Connection"


@dataclass(frozen=True)
class PeerConnected(ConnectionEvent):
    """A connection to ``peer`` finished its upgrade (any path)."""


@dataclass(frozen=True)
class PeerDisconnected(ConnectionEvent):
    """A connection to ``peer`` closed (others to the same peer may remain)."""


@dataclass(frozen=True)
class PeerIdentified(ConnectionEvent):
    """Identify (or identify push) told us about ``peer``."""

    info: Any = None


@dataclass(frozen=True)
class RelayedConnectionUp(ConnectionEvent):
    """A connection to ``peer`` through a relay finished its upgrade (hole punching starts here)."""


@dataclass(frozen=True)
class DirectConnectionUp(ConnectionEvent):
    """A direct or hole-punched connection to ``peer`` finished its upgrade."""


@dataclass(frozen=True)
class ObservedAddrChanged(HostEvent):
    """The external addresses peers report for us changed (``addrs``: the current ones)."""

    addrs: "tuple[Multiaddr, ...]"


@dataclass(frozen=True)
class ReachabilityChanged(HostEvent):
    """AutoNAT reached a new verdict (``reachability``: a ``nat.autonat.Reachability``)."""

    reachability: Any


@dataclass(frozen=True)
class ListenAddrsChanged(HostEvent):
    """The Host started listening somewhere (``addrs``: every address it listens on now)."""

    addrs: "tuple[Multiaddr, ...]"


@dataclass(frozen=True)
class PortMappingChanged(HostEvent):
    """Router port mapping changed what we may advertise (``addrs``: mapped addresses an AutoNAT
    server has dialled back; unconfirmed mappings are never among them)."""

    addrs: "tuple[Multiaddr, ...]"


@dataclass(frozen=True)
class RelayReservationsChanged(HostEvent):
    """The relay circuits we hold (and advertise) changed (``circuit_addrs``: the current ones)."""

    circuit_addrs: "tuple[Multiaddr, ...]"


class Subscription:
    """A bounded queue of the events one subscriber asked for; iterate it, close it when done."""

    def __init__(self, bus: "EventBus", kinds: tuple[type[HostEvent], ...], max_queued: int) -> None:
        self._bus = bus
        self.kinds = kinds
        self._send, self._receive = trio.open_memory_channel[HostEvent](max_queued)

    def wants(self, event: HostEvent) -> bool:
        return not self.kinds or isinstance(event, self.kinds)

    def offer(self, event: HostEvent) -> bool:
        """Queue ``event``; False when the subscriber is too far behind and it was dropped."""
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._bus._drop(self)
        return True

    async def receive(self) -> HostEvent:
        return await self._receive.receive()

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> HostEvent:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._bus._drop(self)
        self._send.close()
        self._receive.close()

    def _end(self) -> None:
        self._send.close()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventBus:
    """Fan-out of HostEvents to any number of bounded subscriptions."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []
        self.dropped = 0

    def subscribe(self, *kinds: type[HostEvent], max_queued: int = MAX_QUEUED_EVENTS) -> Subscription:
        """A subscription to ``kinds`` (every event when none are named)."""
        subscription = Subscription(self, kinds, max_queued)
        self._subscriptions.append(subscription)
        return subscription

    def publish(self, event: HostEvent) -> None:
        for subscription in list(self._subscriptions):
            if subscription.wants(event) and not subscription.offer(event):
                self.dropped += 1

    def _drop(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    def close(self) -> None:
        """End every subscription (their iteration stops once drained)."""
        for subscription in self._subscriptions:
            subscription._end()
        self._subscriptions.clear()


__all__ = [
    "ConnectionEvent",
    "DirectConnectionUp",
    "EventBus",
    "HostEvent",
    "ListenAddrsChanged",
    "ObservedAddrChanged",
    "PeerConnected",
    "PeerDisconnected",
    "PeerIdentified",
    "PortMappingChanged",
    "ReachabilityChanged",
    "RelayReservationsChanged",
    "RelayedConnectionUp",
    "Subscription",
]
