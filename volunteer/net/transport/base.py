"""What every transport gives the Host: raw, unauthenticated byte streams with their addresses,
how each one reaches its peer (``Path``) and which side of the upgrade we play (``Direction``)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..multiaddr import Multiaddr

if TYPE_CHECKING:
    from ..identity import PeerID


class Direction(enum.Enum):
    """Who opened a connection, hence our role in its upgrade (hole punching may pick the role
    apart from who dialed: both ends dial at once and one of them must answer)."""

    INBOUND = "inbound"
    OUTBOUND = "outbound"


class Path(enum.Enum):
    """How a connection reaches its peer; the TUI and `volunteer ping` show it."""

    DIRECT = "direct"
    RELAYED = "relayed"
    HOLE_PUNCHED = "hole-punched"


class RawConnection:
    """A raw (not yet secured) connection and where it goes.

    ``path`` and ``relay_peer`` are set by transports that know better than DIRECT (the relay
    transport, hole punching).
    """

    def __init__(self, stream: trio.abc.HalfCloseableStream, local_addr: Multiaddr, remote_addr: Multiaddr, transport: Any) -> None:
        self.stream = stream
        self.local_addr = local_addr
        self.remote_addr = remote_addr
        self.transport = transport
        self.relay_peer: PeerID | None = None
        self.path: Path | None = None  # None: DIRECT

    def __repr__(self) -> str:
        return f"<RawConnection {self.local_addr} -> {self.remote_addr}>"


InboundHandler = Callable[[RawConnection], Awaitable[None]]


class Transport(Protocol):
    """Dial and listen for one family of multiaddrs."""

    def can_dial(self, addr: Multiaddr) -> bool: ...

    def can_listen(self, addr: Multiaddr) -> bool: ...

    async def dial(
        self,
        addr: Multiaddr,
        *,
        local_port: int | None = None,
        reuse_port_only: bool = False,
        local_host: str | None = None,
    ) -> RawConnection:
        """A raw connection to ``addr``. The options steer the local end of a TCP dial (hole
        punching, AutoNAT dial-back); transports without a local port ignore them."""
        ...

    async def listen(self, addr: Multiaddr, handler: InboundHandler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started(bound_addrs)`` once listening."""
