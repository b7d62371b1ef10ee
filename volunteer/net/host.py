"""The libp2p Host: listens, dials, upgrades, keeps one connection per peer, routes streams to handlers.

    async with open_host(keypair, listen=["/ip4/0.0.0.0/tcp/4001"]) as host:
        host.set_handler("/echo/1.0.0", echo)
        stream = await host.new_stream(peer_id, ["/echo/1.0.0"])

The host owns one nursery. Each connection runs in a task of its own (muxer reader + accept loop);
each inbound stream gets a task that negotiates its protocol and runs the handler. A peer's bad
bytes close that peer's connection and nothing else.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from .. import __version__
from ..errors import (
    ConnectionClosed,
    DialError,
    HandshakeError,
    ListenError,
    NegotiationError,
    PeerIDMismatch,
    RemoteProtocolError,
    VolunteerError,
    describe,
)
from . import limits
from .connection import Connection, Direction, NetStream, Path, negotiate_muxer, upgrade
from .events import (
    DirectConnectionUp,
    EventBus,
    HostEvent,
    PeerConnected,
    PeerDisconnected,
    PeerIdentified,
    RelayedConnectionUp,
)
from .identify import IDENTIFY, IDENTIFY_PUSH, IdentifyInfo, read_identify, write_identify
from .identity import KeyPair, PeerID
from .multiaddr import Multiaddr
from .peerstore import Peerstore
from .perf import PERF, PerfLimits, PerfServer
from .ping import PING, Pinger, serve_ping
from .pool import StreamPool
from .resources import ResourceLimits, ResourceManager, address_key
from .service import Handler, InboundClass, Service
from .transport.base import RawConnection, Transport
from .transport.memory import MemoryTransport
from .transport.tcp import TcpTransport
from .yamux import YamuxConnection
from .streams import close_quietly, reset_quietly

log = logging.getLogger(__name__)

S = TypeVar("S")
AGENT_VERSION = f"volunteer/{__version__}"


@dataclass
class HostConfig:
    """Tunable bounds of a Host (defaults from volunteer.net.limits)."""

    agent_version: str = AGENT_VERSION
    handshake_timeout: float = limits.HANDSHAKE_TIMEOUT
    dial_timeout: float = limits.DIAL_TIMEOUT
    stream_negotiation_timeout: float = limits.STREAM_NEGOTIATION_TIMEOUT
    max_pending_handshakes: int = limits.MAX_PENDING_HANDSHAKES
    max_connections: int = limits.MAX_CONNECTIONS
    identify_on_connect: bool = True
    # Serve /perf/1.0.0 (bounded per peer) so anyone can measure a link to us.
    enable_perf: bool = True
    # Dial …/p2p-circuit/p2p/PEER addresses and accept connections relayed to us (circuit relay v2).
    enable_relay_client: bool = True
    # Run DCUtR: upgrade relayed connections to direct, hole-punched ones.
    enable_hole_punching: bool = True
    perf_limits: PerfLimits = field(default_factory=PerfLimits)
    # Addresses to advertise instead of the listen addresses (a relay behind a port forward, say).
    announce: list[Multiaddr] = field(default_factory=list)


class Host:
    """A libp2p node. Create it with ``open_host``; see the module docstring."""

    def __init__(
        self, keypair: KeyPair, transports: Sequence[Transport], config: HostConfig, services: Sequence[Service] = ()
    ) -> None:
        self.keypair = keypair
        self.peer_id: PeerID = keypair.peer_id
        self.transports = list(transports)
        self.config = config
        self.peerstore = Peerstore()
        self.events = EventBus()
        self.listen_addrs: list[Multiaddr] = []
        self._handlers: dict[str, Handler] = {}
        self._connections: dict[PeerID, list[Connection]] = {}
        self._pending_dials: dict[PeerID, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._services: list[Service] = list(services)
        self.resources: ResourceManager = _install_resource_manager(self._services, config)
        self._closed = False
        # Hooks the NAT layer uses to add addresses (relay circuits, observed) to what we advertise.
        self.extra_addrs: Callable[[], list[Multiaddr]] = lambda: []
        # Hole punching: an inbound connection from one of these addresses is the punch we expect
        # from that peer, and we take the initiator's role on it (DCUtR: the puncher is the client).
        self.expected_punches: dict[Multiaddr, PeerID] = {}
        self.hole_puncher = None  # set by open_host when hole punching is enabled
        self.set_handler(IDENTIFY, self._serve_identify)
        self.set_handler(IDENTIFY_PUSH, self._serve_identify_push)
        self.set_handler(PING, serve_ping)
        self.perf = PerfServer(config.perf_limits)
        if config.enable_perf:
            self.set_handler(PERF, self.perf.handle)

    # --- handlers -------------------------------------------------------------------------------
    def set_handler(self, protocol: str, handler: Handler) -> None:
        """Serve ``protocol``: ``handler(stream)`` runs in its own task for each inbound stream."""
        self._handlers[protocol] = handler

    def remove_handler(self, protocol: str) -> None:
        self._handlers.pop(protocol, None)

    @property
    def protocols(self) -> list[str]:
        return sorted(self._handlers)

    # --- addresses ------------------------------------------------------------------------------
    @property
    def addrs(self) -> list[Multiaddr]:
        """Addresses we advertise (without /p2p): announce list, or listen addresses made concrete."""
        if self.config.announce:
            base = list(self.config.announce)
        else:
            base = []
            for addr in self.listen_addrs:
                for concrete in _expand_unspecified(addr):
                    if concrete not in base:
                        base.append(concrete)
        extras = list(self.extra_addrs())
        for service in self._services:
            extras.extend(service.advertised_addrs())
        for extra in extras:
            if extra not in base:
                base.append(extra)
        return base

    def shareable_addrs(self) -> list[Multiaddr]:
        """Advertised addresses worth giving to other machines: loopback ones are dropped when
        there is anything else (a peer dialing our 127.0.0.1 would reach itself)."""
        addrs = self.addrs
        outside = [a for a in addrs if not _is_loopback(a)]
        return outside or addrs

    def full_addrs(self) -> list[Multiaddr]:
        """Advertised addresses with our /p2p/ID appended: what to give to someone who wants to dial us."""
        return [addr.with_peer_id(self.peer_id) for addr in self.addrs]

    async def listen(self, addr: Multiaddr | str) -> list[Multiaddr]:
        """Start listening on ``addr``; returns the bound addresses (real port for /tcp/0)."""
        addr = Multiaddr(addr)
        transport = self._transport_for(addr, listening=True)
        try:
            bound = await self._nursery.start(transport.listen, addr, self.handle_inbound)
        except* OSError as group:
            exc = group.exceptions[0]
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ListenError(f"cannot listen on {addr}: {reason}") from None
        self.listen_addrs.extend(bound)
        return bound

    def _transport_for(self, addr: Multiaddr, listening: bool = False) -> Transport:
        for transport in self.transports:
            if (transport.can_listen(addr) if listening else transport.can_dial(addr)):
                return transport
        raise DialError(f"no transport for {addr}")

    # --- connections ----------------------------------------------------------------------------
    def connections(self, peer: PeerID | None = None) -> list[Connection]:
        if peer is None:
            return [c for conns in self._connections.values() for c in conns]
        return list(self._connections.get(peer, ()))

    def connection_to(self, peer: PeerID) -> Connection | None:
        """The best open connection to ``peer``: direct before relayed, then the oldest."""
        live = [c for c in self._connections.get(peer, ()) if not c.is_closed]
        if not live:
            return None
        return min(live, key=lambda c: (c.path is Path.RELAYED, c.opened_at))

    def is_connected(self, peer: PeerID) -> bool:
        return self.connection_to(peer) is not None

    async def connect(self, target: PeerID | Multiaddr | str) -> Connection:
        """A connection to ``target`` (a PeerID with known addresses, or a multiaddr), reusing one if open."""
        if isinstance(target, str):
            target = PeerID.from_string(target) if not target.startswith("/") else Multiaddr(target)
        if isinstance(target, Multiaddr):
            peer = target.peer_id
            if peer is not None:
                existing = self.connection_to(peer)
                if existing is not None:
                    return existing
                self.peerstore.add_addrs(peer, [target])
                return await self._dial_peer(peer, [target])
            try:
                return await self._dial_addr(target, None)
            except DialError:
                raise
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                raise DialError(f"could not connect to {target}", {str(target): exc}) from exc
        if target == self.peer_id:
            raise DialError("refusing to dial ourselves")
        existing = self.connection_to(target)
        if existing is not None:
            return existing
        return await self._dial_peer(target, self.peerstore.addrs(target))

    async def _dial_peer(self, peer: PeerID, addrs: list[Multiaddr]) -> Connection:
        # One dial per peer at a time: concurrent callers wait for the first one's result.
        while peer in self._pending_dials:
            await self._pending_dials[peer].wait()
            existing = self.connection_to(peer)
            if existing is not None:
                return existing
        done = self._pending_dials[peer] = trio.Event()
        try:
            if not addrs:
                raise DialError(f"no known addresses for {peer}")
            return await self._dial_staggered(peer, addrs)
        finally:
            del self._pending_dials[peer]
            done.set()

    async def _dial_staggered(self, peer: PeerID, addrs: list[Multiaddr]) -> Connection:
        """Dial all addresses, each a little after the previous one ("happy eyeballs"): a peer
        behind NAT advertises LAN addresses that never answer, and waiting for each to time out
        would delay the relay for tens of seconds. Direct addresses go first, relayed ones after."""
        # Relayed addresses are advertised as ``…/p2p/RELAY/p2p-circuit``: the target is implied.
        addrs = [a.encapsulate(f"/p2p/{peer}") if a.is_relayed() and a.relay_parts()[1] is None else a for a in addrs]
        ordered = sorted(dict.fromkeys(addrs), key=lambda a: a.is_relayed())[: limits.MAX_DIAL_ADDRS]
        causes: dict[str, BaseException] = {}
        winners: list[Connection] = []
        async with trio.open_nursery() as nursery:
            go_on = [trio.Event() for _ in ordered]  # set when an attempt fails: the next need not wait

            async def attempt(index: int, addr: Multiaddr) -> None:
                if index:
                    delay = limits.DIAL_STAGGER + (limits.RELAY_DIAL_DELAY if addr.is_relayed() else 0.0)
                    with trio.move_on_after(delay):
                        await go_on[index - 1].wait()
                try:
                    conn = await self._dial_addr(addr, peer)
                except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                    causes[str(addr)] = exc
                    log.debug("dial %s via %s failed: %s", peer.short(), addr, describe(exc))
                    go_on[index].set()
                    return
                winners.append(conn)
                nursery.cancel_scope.cancel()

            for index, addr in enumerate(ordered):
                nursery.start_soon(attempt, index, addr)
        if winners:
            return min(winners, key=lambda c: c.path is Path.RELAYED)
        raise DialError(f"could not reach {peer}", causes)

    async def _dial_addr(self, addr: Multiaddr, peer: PeerID | None) -> Connection:
        return await self.dial_addr(addr, peer)

    async def dial_addr(
        self,
        addr: Multiaddr,
        peer: PeerID | None = None,
        *,
        role: Direction = Direction.OUTBOUND,
        path: Path | None = None,
        **dial_options,
    ) -> Connection:
        """Dial one address and upgrade it, without connection reuse or dial deduplication.

        ``role`` picks our side of the upgrade: hole punching (TCP simultaneous open) dials from
        both ends, and one of them must then act as the responder. ``dial_options`` go to the
        transport (``local_port=`` for TCP).
        """
        if self._closed:
            raise ConnectionClosed("host is closed")
        transport = self._transport_for(addr)
        dial_target = addr.without_peer_id() if not addr.is_relayed() else addr
        try:
            with trio.fail_after(self.config.dial_timeout):
                raw = await transport.dial(dial_target, **dial_options)
        except trio.TooSlowError:
            raise DialError(f"timed out connecting to {addr}") from None
        except OSError as exc:
            raise DialError(f"cannot connect to {addr}: {exc.strerror or exc}") from exc
        if path is not None:
            raw.path = path
        expected = peer if role is Direction.OUTBOUND else None
        try:
            conn = await self._nursery.start(self._run_connection, raw, role, expected)
        except BaseException:
            await trio.aclose_forcefully(raw.stream)  # cancelled before the connection task owned it
            raise
        if peer is not None and conn.remote_peer != peer:
            await conn.aclose()
            raise PeerIDMismatch(f"dialled {peer} but {conn.remote_peer} answered")
        return conn

    async def handle_inbound(self, raw: RawConnection) -> None:
        """Upgrade and serve a raw connection someone opened to us (transports and the relay
        stop handler call this, in a task of their own; it returns when the connection closes)."""
        for service in self._services:
            verdict = service.classify_inbound(raw)
            if verdict is not None:
                await self._run_classified(raw, verdict)
                return
        punch_peer = self.expected_punches.get(raw.remote_addr)
        if punch_peer is not None:
            # Our punch's SYN lost the race to theirs and the listener got it: same connection, same roles.
            raw.path = Path.HOLE_PUNCHED
            await self._run_connection(raw, Direction.OUTBOUND, punch_peer)
            return
        await self._run_connection(raw, Direction.INBOUND, None)

    async def _run_classified(self, raw: RawConnection, verdict: InboundClass) -> None:
        if verdict.path is not None:
            raw.path = verdict.path
        await self._run_connection(raw, verdict.role, verdict.expected_peer)

    async def _run_connection(
        self,
        raw: RawConnection,
        direction: Direction,
        expected_peer: PeerID | None,
        *,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Upgrade ``raw``, then serve it until it closes. Outbound: started() with the Connection."""
        try:
            conn = await self._upgrade(raw, direction, expected_peer)
        except BaseException as exc:
            await trio.aclose_forcefully(raw.stream)
            accepted = task_status is trio.TASK_STATUS_IGNORED  # nobody waits for this connection
            if accepted and isinstance(exc, Exception):
                # A stranger's failed handshake must never take the listener down.
                known = isinstance(exc, (VolunteerError, OSError, trio.BrokenResourceError))
                log.log(logging.INFO if known else logging.WARNING, "inbound connection from %s failed: %s",
                        raw.remote_addr, describe(exc), exc_info=not known)
                return
            raise
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(conn.muxer.run)
                self._register(conn)
                task_status.started(conn)
                if self.config.identify_on_connect:
                    nursery.start_soon(self._identify_quietly, conn)
                try:
                    while True:
                        inner = await conn.muxer.accept_stream()
                        nursery.start_soon(self._serve_stream, conn, inner)
                except (ConnectionClosed, trio.ClosedResourceError, trio.BrokenResourceError):
                    pass
                nursery.cancel_scope.cancel()
        finally:
            self._unregister(conn)
            with trio.CancelScope(shield=True):
                await conn.muxer.aclose()

    async def _upgrade(self, raw: RawConnection, direction: Direction, expected_peer: PeerID | None) -> Connection:
        inbound = direction is Direction.INBOUND
        slot = self._try_acquire_handshake_slot(raw) if inbound else None
        if inbound and slot is None:
            raise HandshakeError(f"too many pending handshakes from {address_key(raw.remote_addr)} (or in all)")
        first_message_timeout = self.resources.limits.first_message_timeout if inbound else None
        try:
            with trio.fail_after(self.config.handshake_timeout):
                secure, needs_muxer_negotiation = await upgrade(
                    raw, self.keypair, direction, expected_peer, first_message_timeout=first_message_timeout
                )
                muxed_stream = secure
                if needs_muxer_negotiation:
                    muxed_stream = await negotiate_muxer(secure, direction)
        except trio.TooSlowError:
            if inbound:
                self.resources.refuse("address", "handshake_timeout", now=trio.current_time(), detail=str(raw.remote_addr))
            raise HandshakeError(f"handshake with {raw.remote_addr} timed out after {self.config.handshake_timeout}s") from None
        except HandshakeError as exc:
            if inbound and "no multistream header" in str(exc):
                self.resources.refuse("address", "first_message_timeout", now=trio.current_time(), detail=str(raw.remote_addr))
            raise
        finally:
            if slot is not None:
                self.resources.close_handshake(slot)
        scope = self.resources.open_connection(secure.remote_peer, raw.remote_addr, now=trio.current_time())
        if scope is None:
            await trio.aclose_forcefully(secure)
            raise HandshakeError(f"connection from {secure.remote_peer.short()} at {raw.remote_addr} refused: resource limit")
        # From here the muxer owns the scope: it gives it back when the connection ends.
        muxer = YamuxConnection(muxed_stream, is_client=direction is Direction.OUTBOUND, scope=scope)
        path = Path.RELAYED if raw.remote_addr.is_relayed() else (raw.path or Path.DIRECT)
        return Connection(raw, secure, muxer, direction, path)

    def _try_acquire_handshake_slot(self, raw: RawConnection):
        """A pending-handshake slot shared per source address (None: that address's share, or
        the global cap, is taken; the refusal is counted and logged by the resource manager)."""
        return self.resources.open_handshake(raw.remote_addr, now=trio.current_time())

    def _register(self, conn: Connection) -> None:
        peer = conn.remote_peer
        self._connections.setdefault(peer, []).append(conn)
        if conn.direction is Direction.OUTBOUND and not conn.remote_addr.is_relayed():
            self.peerstore.add_addrs(peer, [conn.remote_addr])
        self.peerstore.info(peer).public_key = conn.secure.remote_public_key
        log.debug("connected %r", conn)
        self.events.publish(PeerConnected(peer, conn))
        kind = RelayedConnectionUp if conn.path is Path.RELAYED else DirectConnectionUp
        self.events.publish(kind(peer, conn))

    def _unregister(self, conn: Connection) -> None:
        conns = self._connections.get(conn.remote_peer, [])
        if conn in conns:
            conns.remove(conn)
            if not conns:
                del self._connections[conn.remote_peer]
            log.debug("disconnected %r", conn)
            self.events.publish(PeerDisconnected(conn.remote_peer, conn))

    # --- streams --------------------------------------------------------------------------------
    async def new_stream(self, target: PeerID | Multiaddr | str, protocols: Sequence[str]) -> NetStream:
        """Open a stream to ``target`` speaking the first of ``protocols`` the peer accepts."""
        conn = await self.connect(target)
        return await conn.new_stream(list(protocols))

    async def _serve_stream(self, conn: Connection, inner) -> None:
        try:
            with trio.fail_after(self.config.stream_negotiation_timeout):
                stream = await conn.negotiate_inbound(inner, self._handlers.__contains__)
        except (trio.TooSlowError, NegotiationError, RemoteProtocolError, trio.BrokenResourceError) as exc:
            log.debug("stream negotiation with %s failed: %s", conn.remote_peer.short(), describe(exc))
            return
        handler = self._handlers.get(stream.protocol)
        if handler is None:  # removed while negotiating
            await stream.reset()
            return
        try:
            await handler(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s handler: stream with %s broke: %s", stream.protocol, conn.remote_peer.short(), describe(exc))
        except VolunteerError as exc:
            log.info("%s handler failed for %s: %s", stream.protocol, conn.remote_peer.short(), describe(exc))
            await reset_quietly(stream)
        except Exception:
            log.exception("%s handler crashed for %s", stream.protocol, conn.remote_peer.short())
            await reset_quietly(stream)
        else:
            with trio.move_on_after(1):
                await close_quietly(stream)

    # --- identify and ping ----------------------------------------------------------------------
    def identify_info(self, conn: Connection | None = None) -> IdentifyInfo:
        """What we tell a peer about ourselves (its observed address taken from ``conn``)."""
        return IdentifyInfo(
            public_key=self.keypair.public_key,
            listen_addrs=self.addrs,
            protocols=self.protocols,
            observed_addr=conn.remote_addr if conn is not None and not conn.remote_addr.is_relayed() else None,
            agent_version=self.config.agent_version,
        )

    async def _serve_identify(self, stream: NetStream) -> None:
        await write_identify(stream, self.identify_info(stream.connection))

    async def _serve_identify_push(self, stream: NetStream) -> None:
        info = await read_identify(stream)
        self._apply_identify(stream.connection, info)

    async def identify(self, target: PeerID | Multiaddr | str) -> IdentifyInfo:
        """Ask a peer who it is (and where it sees us); updates the peerstore."""
        conn = await self.connect(target)
        return await self._identify(conn)

    async def _identify(self, conn: Connection) -> IdentifyInfo:
        stream = await conn.new_stream([IDENTIFY])
        try:
            info = await read_identify(stream)
        finally:
            await close_quietly(stream)
        self._apply_identify(conn, info)
        return info

    async def _identify_quietly(self, conn: Connection) -> None:
        try:
            with trio.fail_after(self.config.handshake_timeout):
                await self._identify(conn)
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify with %s failed: %s", conn.remote_peer.short(), describe(exc))

    def _apply_identify(self, conn: Connection, info: IdentifyInfo) -> None:
        peer = conn.remote_peer
        if info.public_key is not None and info.peer_id != peer:
            log.info("identify from %s carries another peer's key; ignored", peer.short())
            return
        entry = self.peerstore.info(peer)
        entry.protocols = info.protocols
        entry.agent_version = info.agent_version
        entry.protocol_version = info.protocol_version
        if info.observed_addr is not None:
            entry.observed_addr = info.observed_addr
        if info.listen_addrs:
            self.peerstore.replace_addrs(peer, info.listen_addrs)
        self.events.publish(PeerIdentified(peer, conn, info))

    async def push_identify(self) -> None:
        """Tell every connected peer our current addresses and protocols (identify push)."""
        async with trio.open_nursery() as nursery:
            for conn in self.connections():
                nursery.start_soon(self._push_to, conn)

    async def _push_to(self, conn: Connection) -> None:
        try:
            with trio.fail_after(self.config.handshake_timeout):
                stream = await conn.new_stream([IDENTIFY_PUSH])
                await write_identify(stream, self.identify_info(conn))
                await close_quietly(stream)
        except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify push to %s failed: %s", conn.remote_peer.short(), describe(exc))

    async def open_pinger(self, target: PeerID | Multiaddr | str) -> Pinger:
        """A ping stream to ``target``: ``await pinger.ping()`` returns one RTT in seconds."""
        return Pinger(await self.new_stream(target, [PING]))

    # --- services and tasks ----------------------------------------------------------------------
    def start_soon(self, async_fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        """Run ``async_fn(*args)`` in the Host's nursery: it lives until it returns or the Host closes.
        Raises RuntimeError when the Host is not running (closing, or not yet opened)."""
        if self._nursery is None or self._closed:
            raise RuntimeError("the host is not running")
        self._nursery.start_soon(async_fn, *args, name=name)

    def service(self, kind: type[S]) -> S | None:
        """The first service of type ``kind`` running on this Host, or None."""
        for service in self._services:
            if isinstance(service, kind):
                return service
        return None

    @property
    def services(self) -> list[Service]:
        return list(self._services)

    async def add_service(self, service: Service) -> None:
        """Register ``service``'s protocols and run it in the Host's nursery; returns once it started."""
        if self._nursery is None or self._closed:
            raise RuntimeError("the host is not running")
        if service not in self._services:
            self._services.append(service)
        await self._start_service(service)

    async def _start_service(self, service: Service) -> None:
        for protocol, handler in service.handlers().items():
            self.set_handler(protocol, handler)
        assert self._nursery is not None
        await self._nursery.start(_run_service, service, self)

    # --- lifetime -----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Say GoAway on every connection and stop every task the host started."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            async with trio.open_nursery() as nursery:
                for conn in self.connections():
                    nursery.start_soon(conn.aclose)
        self.events.close()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


def default_transports() -> list[Transport]:
    return [TcpTransport(), MemoryTransport()]


@asynccontextmanager
async def open_host(
    keypair: KeyPair | None = None,
    listen: Sequence[Multiaddr | str] = (),
    *,
    transports: Sequence[Transport] | None = None,
    config: HostConfig | None = None,
    services: Sequence[Service] = (),
):
    """Run a Host for the duration of the ``async with`` block, with ``services`` running on it
    (a ``StreamPool`` is added when none is given: the DHT and expert calls share it)."""
    services = list(services)
    if not any(isinstance(s, StreamPool) for s in services):
        services.append(StreamPool())
    host = Host(keypair or KeyPair.generate(), transports or default_transports(), config or HostConfig(), services)
    if host.config.enable_relay_client:
        from .nat.relay_client import install_relay_client

        install_relay_client(host)
    async with trio.open_nursery() as nursery:
        host._nursery = nursery
        try:
            for service in host.services:
                await host._start_service(service)
            for addr in listen:
                await host.listen(addr)
            if host.config.enable_hole_punching:
                from .nat.dcutr import HolePuncher

                host.hole_puncher = HolePuncher(host)
                await nursery.start(host.hole_puncher.run)
            yield host
        finally:
            await host.aclose()


def _install_resource_manager(services: list[Service], config: HostConfig) -> ResourceManager:
    """The ResourceManager among ``services``, or a default one added to them (its connection
    and handshake caps taken from ``config``, so HostConfig's limits keep their meaning)."""
    for service in services:
        if isinstance(service, ResourceManager):
            return service
    manager = ResourceManager(ResourceLimits(
        system_connections=config.max_connections, system_pending_handshakes=config.max_pending_handshakes
    ))
    services.append(manager)
    return manager


async def _run_service(service: Service, host: Host, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    await service.run(host, task_status=task_status)


def _is_loopback(addr: Multiaddr) -> bool:
    components = addr.components
    return bool(components) and components[0][0] in ("ip4", "ip6") and (
        components[0][1].startswith("127.") or components[0][1] == "::1"
    )


def _expand_unspecified(addr: Multiaddr) -> list[Multiaddr]:
    """Replace 0.0.0.0 / :: with this machine's addresses (loopback and the hostname's)."""
    components = addr.components
    if not components or components[0][1] not in ("0.0.0.0", "::"):
        return [addr]
    family = socket.AF_INET if components[0][0] == "ip4" else socket.AF_INET6
    loopback = "127.0.0.1" if family == socket.AF_INET else "::1"
    hosts = [loopback]
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM):
            ip = info[4][0]
            if ip not in hosts:
                hosts.append(ip)
    except OSError:
        pass
    rest = str(addr)[len(f"/{components[0][0]}/{components[0][1]}") :]
    return [Multiaddr(f"/{components[0][0]}/{ip}{rest}") for ip in hosts]




__all__ = ["AGENT_VERSION", "Handler", "Host", "HostConfig", "HostEvent", "open_host"]
