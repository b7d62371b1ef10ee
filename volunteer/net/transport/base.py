"""What every transport gives the Host: raw, unauthenticated byte streams (or, from QUIC, sessions
already secured and multiplexed) with their addresses, how each one reaches its peer (``Path``)
and which side of the upgrade we play (``Direction``)."""

from __future__ import annotations

import enum
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..multiaddr import Multiaddr
from .pathloss import PathLoss, tcp_loss

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


class NativeSession(Protocol):
    """A connection that a transport secured and multiplexed itself (QUIC): the Host skips
    Noise and yamux and uses it as both the secure channel and the muxer."""

    closed: trio.Event

    @property
    def remote_peer(self) -> "PeerID": ...

    def check_expected(self, expected: "PeerID | None") -> None: ...

    def attach_scope(self, scope: Any) -> None: ...

    async def aclose(self) -> None: ...

    def loss(self) -> PathLoss | None: ...


class RawConnection:
    """A connection as a transport hands it over, and where it goes.

    Stream transports (TCP, memory, a relay circuit) give a byte ``stream`` still to be secured;
    QUIC gives a ``session`` that is already secured and multiplexed (and no stream).
    ``path`` and ``relay_peer`` are set by transports that know better than DIRECT (the relay
    transport, hole punching).
    """

    def __init__(
        self,
        stream: trio.abc.HalfCloseableStream | None,
        local_addr: Multiaddr,
        remote_addr: Multiaddr,
        transport: Any,
        *,
        session: NativeSession | None = None,
    ) -> None:
        if stream is not None and session is not None:
            raise ValueError("a raw connection has a byte stream or a native session, not both")
        self.stream = stream
        self.session = session
        self.local_addr = local_addr
        self.remote_addr = remote_addr
        self.transport = transport
        self.relay_peer: PeerID | None = None
        self.path: Path | None = None  # None: DIRECT

    @property
    def byte_stream(self) -> trio.abc.HalfCloseableStream:
        """The stream to secure; ValueError for a connection that came secured (QUIC)."""
        if self.stream is None:
            raise ValueError(f"{self} came secured and multiplexed: it has no byte stream")
        return self.stream

    def loss(self) -> PathLoss | None:
        """What the path lost of what we sent, as the transport sees it (None: it cannot tell)."""
        if self.session is not None:
            return self.session.loss()
        sock = getattr(self.stream, "socket", None)  # a trio.SocketStream: TCP
        return tcp_loss(sock) if sock is not None and sock.type == socket.SOCK_STREAM else None

    async def abort(self) -> None:
        """Close the connection at once (a failed upgrade, a cancelled dial)."""
        if self.session is not None:
            with trio.CancelScope() as forcefully:
                forcefully.cancel()
                await self.session.aclose()
        elif self.stream is not None:
            await trio.aclose_forcefully(self.stream)

    def __repr__(self) -> str:
        return f"RawConnection({self.local_addr} -> {self.remote_addr})"


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
