"""How features plug into a Host: the ``Service`` interface and the ``HostAPI`` a service sees.

A service is handed to ``open_stack(..., services=[...])`` or ``open_host(..., services=[...])``
(or ``await host.add_service(s)`` later) the way rust-libp2p's behaviours plug into a Swarm: it
says which protocols it serves, which addresses it advertises and how it classifies an inbound
connection, and runs in a task of the Host's nursery. It learns what happens from the Host's event bus and asks the Host through the
public methods of ``HostAPI``; it never assigns the Host's attributes or reaches for its nursery.

    class Echo(BaseService):
        def handlers(self):
            return {"/echo/1.0.0": self._echo}
        async def _echo(self, stream):
            await stream.send_all(await stream.receive_some())
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import trio

if TYPE_CHECKING:
    from .config import HostConfig
    from .connection import Connection, NetStream
    from .events import EventBus
    from .identity import KeyPair, PeerID
    from .multiaddr import Multiaddr
    from .peerstore import Peerstore
    from .transport.base import Direction, Path, RawConnection, Transport

Handler = Callable[["NetStream"], Awaitable[None]]
S = TypeVar("S")


@dataclass(frozen=True)
class InboundClass:
    """What a service says about an inbound raw connection before it is upgraded.

    Hole punching dials from both ends at once: the SYN that reaches our listener may be the punch
    we are waiting for, and then we keep the role we chose for it (``role``), check that the peer
    is the one we expect, and label the connection's path.
    """

    role: "Direction"
    expected_peer: "PeerID | None" = None
    path: "Path | None" = None


@runtime_checkable
class HostAPI(Protocol):
    """The part of a Host that services, the DHT, the experts and the CLI use."""

    peer_id: "PeerID"
    keypair: "KeyPair"
    peerstore: "Peerstore"
    events: "EventBus"
    listen_addrs: list["Multiaddr"]
    config: "HostConfig"

    @property
    def addrs(self) -> list["Multiaddr"]: ...

    @property
    def protocols(self) -> list[str]: ...

    def shareable_addrs(self) -> list["Multiaddr"]: ...

    def addrs_for(self, via: "Multiaddr | None") -> list["Multiaddr"]: ...

    def full_addrs(self) -> list["Multiaddr"]: ...

    def set_handler(self, protocol: str, handler: Handler) -> None: ...

    def remove_handler(self, protocol: str) -> None: ...

    def connections(self, peer: "PeerID | None" = None) -> list["Connection"]: ...

    def connection_to(self, peer: "PeerID") -> "Connection | None": ...

    def is_connected(self, peer: "PeerID") -> bool: ...

    async def connect(self, target: "PeerID | Multiaddr | str") -> "Connection": ...

    async def dial_addr(self, addr: "Multiaddr", peer: "PeerID | None" = None, **options: Any) -> "Connection": ...

    async def handle_inbound(self, raw: "RawConnection") -> None: ...

    def add_transport(self, transport: "Transport") -> None: ...

    async def new_stream(self, target: "PeerID | Multiaddr | str", protocols: Sequence[str]) -> "NetStream": ...

    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None: ...

    def service(self, kind: type[S]) -> S | None: ...

    async def add_service(self, service: "Service") -> None: ...


@runtime_checkable
class Service(Protocol):
    """A feature that runs on a Host (see the module docstring)."""

    def handlers(self) -> Mapping[str, Handler]:
        """Protocols this service serves, registered before ``run`` starts."""
        ...

    def advertised_addrs(self) -> Sequence["Multiaddr"]:
        """Addresses to advertise besides the listen addresses (relay circuits, say); read on demand."""
        ...

    def classify_inbound(self, raw: "RawConnection") -> InboundClass | None:
        """Say how to upgrade an inbound connection, or None to leave it to the default (responder)."""
        ...

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run for the Host's lifetime; call ``task_status.started()`` once ready."""
        ...


class BaseService:
    """Defaults for a Service: no protocols, no addresses, no opinion on inbound connections, and
    a ``run`` that only keeps ``self.host`` (subclasses override what they need)."""

    host: HostAPI

    def handlers(self) -> Mapping[str, Handler]:
        return {}

    def advertised_addrs(self) -> Sequence["Multiaddr"]:
        return ()

    def classify_inbound(self, raw: "RawConnection") -> InboundClass | None:
        return None

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        task_status.started()


__all__ = ["BaseService", "Handler", "HostAPI", "InboundClass", "Service"]
