"""Host events (connected, disconnected, identified) for the TUI and the NAT layer.

Subscribers get a bounded channel; a subscriber that does not keep up loses events (counted in
``dropped``) rather than blocking the network code that publishes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from .connection import Connection
    from .identity import PeerID

MAX_QUEUED_EVENTS = 256


@dataclass(frozen=True)
class HostEvent:
    """Base class of everything the Host publishes."""

    peer: "PeerID"
    connection: "Connection"


@dataclass(frozen=True)
class PeerConnected(HostEvent):
    """A connection to ``peer`` finished its upgrade."""


@dataclass(frozen=True)
class PeerDisconnected(HostEvent):
    """A connection to ``peer`` closed (others to the same peer may remain)."""


@dataclass(frozen=True)
class PeerIdentified(HostEvent):
    """Identify (or identify push) told us about ``peer``."""

    info: Any = None


class EventBus:
    """Fan-out of HostEvents to any number of bounded subscriber channels."""

    def __init__(self) -> None:
        self._subscribers: list[trio.MemorySendChannel] = []
        self.dropped = 0

    def subscribe(self, max_queued: int = MAX_QUEUED_EVENTS) -> trio.MemoryReceiveChannel:
        send, receive = trio.open_memory_channel(max_queued)
        self._subscribers.append(send)
        return receive

    def publish(self, event: HostEvent) -> None:
        for channel in list(self._subscribers):
            try:
                channel.send_nowait(event)
            except trio.WouldBlock:
                self.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(channel)

    def close(self) -> None:
        for channel in self._subscribers:
            channel.close()
        self._subscribers.clear()
