"""A libp2p connection (raw transport → multistream → Noise → yamux) and the streams opened on it.

``upgrade`` turns a RawConnection into a secured, multiplexed ``Connection``: multistream-select
picks `/noise`, Noise authenticates the peer (and, when both sides list yamux in the handshake's
stream-muxer extension, also settles the muxer: "inlined muxer negotiation", one round trip less),
otherwise multistream-select picks `/yamux/1.0.0` inside the secure channel.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any, Protocol, cast

import trio

from ..errors import HandshakeError, NegotiationError, RemoteProtocolError
from .identity import KeyPair, PeerID, PublicKey
from .multiaddr import Multiaddr
from .multistream import LazyStream, lazy_outbound, select_inbound, select_outbound
from .noise import NoiseConnection, secure_inbound, secure_outbound
from .streams import BufferedStream, Resettable, reset_quietly, send_all_then_eof
from .transport.base import Direction, Path, RawConnection
from .yamux import YamuxConnection, YamuxStream

NOISE = "/noise"
YAMUX = "/yamux/1.0.0"
MUXERS = (YAMUX,)


_connection_ids = itertools.count(1)


class NetStream(trio.abc.HalfCloseableStream):
    """A negotiated stream: a yamux stream that knows its protocol and connection."""

    def __init__(self, inner: BufferedStream | LazyStream, protocol: str, connection: "Connection") -> None:
        self._inner: BufferedStream | LazyStream | trio.abc.HalfCloseableStream = inner
        self._layered = True  # until negotiation is over and nothing is buffered above the muxer
        self.protocol = protocol
        self.connection = connection

    @property
    def remote_peer(self) -> PeerID:
        return self.connection.remote_peer

    async def send_all(self, data) -> None:
        await self._inner.send_all(data)
        self.connection.bytes_sent += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self.connection.bytes_received += len(data)
        if self._layered:
            self._unlayer()
        return data

    def _unlayer(self) -> None:
        # Once multistream has had its answer and left no bytes buffered, its layers only pass
        # calls through: go to the muxer's stream directly (two coroutine frames fewer on every
        # read and write of an expert call, and on each of their waits).
        settled = self._inner.settled() if isinstance(self._inner, (BufferedStream, LazyStream)) else None
        if settled is not None:
            self._inner, self._layered = settled, False

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def send_all_then_eof(self, data) -> None:
        """Send ``data`` and close our side, in one write when the window allows (a last reply)."""
        await send_all_then_eof(self._inner, data)
        self.connection.bytes_sent += len(data)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def reset(self) -> None:
        """Abort the stream in both directions (yamux RST)."""
        await cast(Resettable, self._inner).reset()


class SecureChannel(Protocol):
    """Who the peer proved to be: a Noise session, or a QUIC session after its TLS handshake."""

    @property
    def remote_peer(self) -> PeerID: ...

    @property
    def remote_public_key(self) -> PublicKey: ...


class Muxer(Protocol):
    """What the Host runs a connection's streams on: yamux, or a QUIC session's own streams."""

    closed: trio.Event
    rtt: float | None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None: ...

    async def open_stream(self, *, announce: bool = True) -> Any: ...

    async def accept_stream(self) -> Any: ...

    async def ping(self) -> float: ...

    async def aclose(self) -> None: ...


class Connection:
    """A secured, multiplexed connection to one peer."""

    def __init__(
        self,
        raw: RawConnection,
        secure: SecureChannel,
        muxer: Muxer,
        direction: Direction,
        path: Path = Path.DIRECT,
    ) -> None:
        self.id = next(_connection_ids)
        self.raw = raw
        self.secure = secure
        self.muxer = muxer
        self.direction = direction
        self.path = path
        self.opened_at = trio.current_time()
        # stream payload bytes (after multistream negotiation), for the dashboard's traffic column
        self.bytes_sent = 0
        self.bytes_received = 0
        # The relay's peer ID, for relayed connections (set by the relay transport).
        self.relay_peer: PeerID | None = getattr(raw, "relay_peer", None)

    @property
    def remote_peer(self) -> PeerID:
        return self.secure.remote_peer

    @property
    def local_addr(self) -> Multiaddr:
        return self.raw.local_addr

    @property
    def remote_addr(self) -> Multiaddr:
        return self.raw.remote_addr

    @functools.cached_property
    def transport(self) -> str:
        """The transport carrying this connection: ``quic``, ``tcp``, ``memory`` or ``relay``
        (of its remote address, which never changes: worked out once, a trainer asks per call)."""
        if self.remote_addr.is_relayed():
            return "relay"
        names = self.remote_addr.protocols()
        if "quic-v1" in names:
            return "quic"
        return "tcp" if "tcp" in names else (names[0] if names else "unknown")

    @property
    def path_label(self) -> str:
        """``direct quic``, ``direct tcp`` or ``relayed``: how this connection reaches its peer."""
        if self.path is Path.RELAYED or self.transport == "relay":
            return "relayed"
        return f"direct {self.transport}"

    def loses_packets(self) -> bool:
        """Whether this path loses what we send with nothing to repair it (each loss then costs
        a round trip or more), or more than its repairs absorb: a connection to the same peer
        that does neither is better (see ``PathLoss.hurts``)."""
        loss = self.raw.loss()
        return loss is not None and loss.hurts()

    @property
    def is_closed(self) -> bool:
        return self.muxer.closed.is_set()

    @property
    def rtt(self) -> float | None:
        return self.muxer.rtt

    async def new_stream(self, protocols: Sequence[str], *, lazy: bool = True) -> NetStream:
        """Open a stream and negotiate one of ``protocols`` (first preferred).

        With a single protocol and ``lazy``, negotiation rides along with the first write (0-RTT);
        a refusal then surfaces as NegotiationError on the first read.
        """
        if not protocols:
            raise ValueError("new_stream needs at least one protocol")
        # The SYN rides with the first write: the dialer proposes at once (select_outbound), or
        # with its first data, its first read or its close (LazyStream): each one flushes it.
        inner = await self.muxer.open_stream(announce=False)
        buffered = BufferedStream(inner)
        try:
            if lazy and len(protocols) == 1:
                return NetStream(lazy_outbound(buffered, protocols[0]), protocols[0], self)
            protocol = await select_outbound(buffered, protocols)
        except BaseException:
            await reset_quietly(inner)
            raise
        return NetStream(buffered, protocol, self)

    async def negotiate_inbound(self, inner: YamuxStream, supported) -> NetStream:
        """Negotiate the protocol of a stream the peer opened (``supported``: a predicate or a set)."""
        buffered = BufferedStream(inner)
        try:
            protocol = await select_inbound(buffered, supported, exact=True)
        except BaseException:
            await reset_quietly(inner)
            raise
        return NetStream(buffered, protocol, self)

    async def aclose(self) -> None:
        await self.muxer.aclose()

    def describe_path(self, *, with_transport: bool = False) -> str:
        """``direct``, ``hole-punched`` or ``relayed via …``; ``with_transport``: ``direct tcp``,
        ``hole-punched quic`` (a relayed path's transport is the relay's)."""
        if self.path is Path.RELAYED and self.relay_peer is not None:
            return f"relayed via {self.relay_peer.short()}"
        if with_transport and self.path_label != "relayed":
            return f"{self.path.value} {self.transport}"
        return self.path.value

    def __repr__(self) -> str:
        return f"Connection(#{self.id} {self.direction.value} {self.remote_peer.short()} {self.describe_path()} {self.remote_addr})"



async def upgrade(
    raw: RawConnection,
    identity: KeyPair,
    direction: Direction,
    expected_peer: PeerID | None = None,
    *,
    first_message_timeout: float | None = None,
) -> tuple[NoiseConnection, bool]:
    """Secure ``raw`` with Noise. Returns the secure channel and whether yamux still needs
    multistream negotiation (False when it was inlined in the Noise handshake).

    The caller bounds the time this takes; any failure is raised as HandshakeError. Inbound, the
    dialer's first multistream message must come within ``first_message_timeout`` seconds.
    """
    stream = BufferedStream(raw.byte_stream)
    try:
        if direction is Direction.OUTBOUND:
            await select_outbound(stream, [NOISE])
            secure = await secure_outbound(stream, identity, expected_peer, MUXERS)
        else:
            await select_inbound(stream, {NOISE}, header_timeout=first_message_timeout)
            secure = await secure_inbound(stream, identity, MUXERS)
    except HandshakeError:
        raise
    except (RemoteProtocolError, NegotiationError, trio.BrokenResourceError) as exc:
        raise HandshakeError(f"security handshake failed: {exc}") from exc
    return secure, YAMUX not in secure.remote_muxers


async def negotiate_muxer(secure: NoiseConnection, direction: Direction) -> trio.abc.Stream:
    """multistream-select `/yamux/1.0.0` inside the secure channel (when it was not inlined)."""
    stream = BufferedStream(secure)
    try:
        if direction is Direction.OUTBOUND:
            await select_outbound(stream, [YAMUX])
        else:
            await select_inbound(stream, {YAMUX})
    except (RemoteProtocolError, NegotiationError, trio.BrokenResourceError) as exc:
        raise HandshakeError(f"muxer negotiation failed: {exc}") from exc
    return stream
