"""identify (`/ipfs/id/1.0.0`) and identify push (`/ipfs/id/push/1.0.0`).

The responder of an identify stream writes one varint-delimited Identify protobuf and closes; a
pusher opens a push stream and writes its own. Encoding/decoding is pure; ``read_identify`` and
``write_identify`` are the thin stream parts; ``Identify`` is the Host service that serves both
protocols, identifies every new connection, keeps the peerstore current and publishes
``PeerIdentified``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from .. import __version__
from ..errors import MultiaddrError, PeerIDError, RemoteProtocolError, VolunteerError, describe
from .addresses import for_peer
from .events import PeerConnected, PeerIdentified
from .identity import PeerID, PublicKey
from .limits import MAX_IDENTIFY_ADDRS, MAX_IDENTIFY_MESSAGE, MAX_IDENTIFY_PROTOCOLS
from .multiaddr import Multiaddr
from . import limits
from .pb import identify_pb2
from .pb.decode import parse
from .service import BaseService, Handler, HostAPI
from .streams import BufferedStream, close_quietly

if TYPE_CHECKING:
    from .connection import Connection, NetStream
from .varint import decode_uvarint, encode_uvarint

log = logging.getLogger(__name__)

IDENTIFY = "/ipfs/id/1.0.0"
IDENTIFY_PUSH = "/ipfs/id/push/1.0.0"
PROTOCOL_VERSION = "ipfs/0.1.0"
AGENT_VERSION = f"volunteer/{__version__}"


@dataclass
class IdentifyInfo:
    """The decoded content of an Identify message (fields the peer left out are empty)."""

    public_key: PublicKey | None = None
    listen_addrs: list[Multiaddr] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    observed_addr: Multiaddr | None = None
    agent_version: str = ""
    protocol_version: str = ""
    signed_peer_record: bytes = b""

    @property
    def peer_id(self) -> PeerID | None:
        return PeerID.from_public_key(self.public_key) if self.public_key else None


def encode_identify(info: IdentifyInfo) -> bytes:
    """The Identify protobuf, varint-delimited as go-libp2p and the spec write it."""
    msg = identify_pb2.Identify()
    msg.protocolVersion = info.protocol_version or PROTOCOL_VERSION
    msg.agentVersion = info.agent_version
    if info.public_key is not None:
        msg.publicKey = info.public_key.to_protobuf()
    msg.listenAddrs.extend(addr.to_bytes() for addr in info.listen_addrs[:MAX_IDENTIFY_ADDRS])
    msg.protocols.extend(info.protocols[:MAX_IDENTIFY_PROTOCOLS])
    if info.observed_addr is not None:
        msg.observedAddr = info.observed_addr.to_bytes()
    if info.signed_peer_record:
        msg.signedPeerRecord = info.signed_peer_record
    body = msg.SerializeToString()
    return encode_uvarint(len(body)) + body


def _split_delimited(data: bytes) -> list[bytes] | None:
    """Split ``data`` into varint-delimited messages, or None if it is not exactly such a sequence."""
    parts = []
    pos = 0
    try:
        while pos < len(data):
            decoded = decode_uvarint(data, pos)
            if decoded is None:
                return None
            length, pos = decoded
            if pos + length > len(data):
                return None
            parts.append(data[pos : pos + length])
            pos += length
    except RemoteProtocolError:
        return None
    return parts


def _parse_delimited(data: bytes):
    parts = _split_delimited(data)
    if parts is None:
        return None
    msg = identify_pb2.Identify()
    try:
        for part in parts:
            msg.MergeFrom(parse(identify_pb2.Identify, part, "identify message"))
    except RemoteProtocolError:
        return None
    return msg


def decode_identify(data: bytes) -> IdentifyInfo:
    """Decode what an identify responder sent before closing.

    go-libp2p may split a large message into several delimited ones (they merge); some older
    implementations send the protobuf without a length prefix, which we accept too.
    """
    if len(data) > MAX_IDENTIFY_MESSAGE:
        raise RemoteProtocolError(f"identify message of {len(data)} bytes exceeds {MAX_IDENTIFY_MESSAGE}")
    msg = _parse_delimited(data)
    if msg is None:
        msg = parse(identify_pb2.Identify, data, "identify message")

    info = IdentifyInfo(
        agent_version=msg.agentVersion[:256],
        protocol_version=msg.protocolVersion[:64],
        protocols=[p for p in msg.protocols[:MAX_IDENTIFY_PROTOCOLS] if len(p) <= 256],
        signed_peer_record=msg.signedPeerRecord,
    )
    if msg.HasField("publicKey"):
        try:
            info.public_key = PublicKey.from_protobuf(msg.publicKey)
        except PeerIDError as exc:
            raise RemoteProtocolError(f"identify carries a bad public key: {exc}") from None
    for raw in msg.listenAddrs[:MAX_IDENTIFY_ADDRS]:
        try:
            info.listen_addrs.append(Multiaddr.from_bytes(raw))
        except MultiaddrError:
            # Peers advertise transports we do not know (webrtc, certhash…): skip those addresses.
            log.debug("identify: skipping an address we cannot parse")
    if msg.HasField("observedAddr"):
        try:
            info.observed_addr = Multiaddr.from_bytes(msg.observedAddr)
        except MultiaddrError:
            log.debug("identify: unparsable observed address")
    return info


async def write_identify(stream, info: IdentifyInfo) -> None:
    """Send our Identify on ``stream`` and close our side."""
    await stream.send_all(encode_identify(info))
    await stream.send_eof()


async def read_identify(stream) -> IdentifyInfo:
    """Read a whole Identify message (until the peer closes its side)."""
    buffered = stream if isinstance(stream, BufferedStream) else BufferedStream(stream)
    data = await buffered.receive_until_eof(MAX_IDENTIFY_MESSAGE, "identify message")
    return decode_identify(data)


class Identify(BaseService):
    """The identify protocols as a Host service (one of the standard services, ``net.stack``).

    ``identify_on_connect``: ask every new connection's peer who it is; ``agent_version``: what we
    tell peers we run."""

    def __init__(self, identify_on_connect: bool = True, agent_version: str = AGENT_VERSION) -> None:
        self.identify_on_connect = identify_on_connect
        self.agent_version = agent_version

    def handlers(self) -> dict[str, Handler]:
        return {IDENTIFY: self._serve, IDENTIFY_PUSH: self._serve_push}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        if not self.identify_on_connect:
            task_status.started()
            return
        # One event per connection: a queue as long as the connection limit loses none.
        with host.events.subscribe(PeerConnected, max_queued=limits.MAX_CONNECTIONS) as events:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for event in events:
                    assert isinstance(event, PeerConnected)
                    nursery.start_soon(self._identify_quietly, event.connection)

    def info_for(self, conn: "Connection | None" = None) -> IdentifyInfo:
        """What we tell a peer about ourselves (its observed address taken from ``conn``)."""
        return IdentifyInfo(
            public_key=self.host.keypair.public_key,
            # never our loopback to a peer off this machine (go-libp2p's identify neither)
            listen_addrs=self.host.addrs_for(conn.remote_addr if conn is not None else None),
            protocols=self.host.protocols,
            observed_addr=conn.remote_addr if conn is not None and not conn.remote_addr.is_relayed() else None,
            agent_version=self.agent_version,
        )

    async def _serve(self, stream: "NetStream") -> None:
        await write_identify(stream, self.info_for(stream.connection))

    async def _serve_push(self, stream: "NetStream") -> None:
        info = await read_identify(stream)
        self._apply(stream.connection, info)

    async def ask(self, target: PeerID | Multiaddr | str) -> IdentifyInfo:
        """Connect to ``target`` (or reuse a connection) and ask who it is; updates the peerstore."""
        return await self.identify(await self.host.connect(target))

    async def identify(self, conn: "Connection") -> IdentifyInfo:
        """Ask the peer on ``conn`` who it is (and where it sees us); updates the peerstore."""
        stream = await conn.new_stream([IDENTIFY])
        try:
            info = await read_identify(stream)
        finally:
            await close_quietly(stream)
        self._apply(conn, info)
        return info

    async def _identify_quietly(self, conn: "Connection") -> None:
        try:
            with trio.fail_after(self.host.config.handshake_timeout):
                await self.identify(conn)
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify with %s failed: %s", conn.remote_peer.short(), describe(exc))

    def _apply(self, conn: "Connection", info: IdentifyInfo) -> None:
        peer = conn.remote_peer
        if info.public_key is not None and info.peer_id != peer:
            log.info("identify from %s carries another peer's key; ignored", peer.short())
            return
        entry = self.host.peerstore.info(peer)
        entry.protocols = info.protocols
        entry.agent_version = info.agent_version
        entry.protocol_version = info.protocol_version
        if info.observed_addr is not None:
            entry.observed_addr = info.observed_addr
        # what the peer cannot mean for us (its loopback, unless we reached it over ours) is dropped
        listen_addrs = for_peer(info.listen_addrs, conn.remote_addr)
        if listen_addrs:
            self.host.peerstore.replace_addrs(peer, listen_addrs)
        self.host.events.publish(PeerIdentified(peer, conn, info))

    async def push(self) -> None:
        """Tell every connected peer our current addresses and protocols (identify push)."""
        async with trio.open_nursery() as nursery:
            for conn in self.host.connections():
                nursery.start_soon(self._push_to, conn)

    async def _push_to(self, conn: "Connection") -> None:
        try:
            with trio.fail_after(self.host.config.handshake_timeout):
                stream = await conn.new_stream([IDENTIFY_PUSH])
                await write_identify(stream, self.info_for(conn))
                await close_quietly(stream)
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify push to %s failed: %s", conn.remote_peer.short(), describe(exc))


def identify_of(host: HostAPI) -> Identify:
    """The Host's identify service (one of the standard services of ``net.stack``)."""
    identify = host.service(Identify)
    if identify is None:
        raise RuntimeError("this host runs no Identify service")
    return identify
