"""The libp2p Host: listens, dials, upgrades, keeps one connection per peer, routes streams to handlers.

    async with open_host(keypair, listen=["/ip4/0.0.0.0/tcp/4001"]) as host:
        host.set_handler("/echo/1.0.0", echo)
        stream = await host.new_stream(peer_id, ["/echo/1.0.0"])

The host owns one nursery. Each connection runs in a task of its own (muxer reader + accept loop);
each inbound stream gets a task that negotiates its protocol and runs the handler. A peer's bad
bytes close that peer's connection and nothing else.

``open_host`` runs exactly the services it is given, plus the resource manager that guards every
handshake; the standard ones (identify, ping, the stream pool, the NAT wing...) are listed and
opened by ``volunteer.net.stack``.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

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
from .addresses import advertised, for_peer, shareable
from .config import HostConfig
from .connection import Connection, NetStream, negotiate_muxer, upgrade
from .events import (
    DirectConnectionUp,
    EventBus,
    HostEvent,
    ListenAddrsChanged,
    PeerConnected,
    PeerDisconnected,
    RelayedConnectionUp,
)
from .identity import KeyPair, PeerID
from .dialing import dial_staggered
from .multiaddr import Multiaddr
from .peerstore import Peerstore
from .resources import ResourceLimits, ResourceManager, StreamScope, address_key
from .service import Handler, InboundClass, Service
from .streams import close_quietly, reset_quietly
from .transport.base import Direction, Path, RawConnection, Transport
from .yamux import YamuxConnection, YamuxStream

log = logging.getLogger(__name__)

S = TypeVar("S")


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
        self.resources: ResourceManager = install_resource_manager(self._services, config)
        self._closed = False

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
        """Addresses we advertise (without /p2p): announce list, or listen addresses made concrete,
        then what services add (relay circuits)."""
        extras = [addr for service in self._services for addr in service.advertised_addrs()]
        return advertised(self.config.announce, self.listen_addrs, extras)

    def shareable_addrs(self) -> list[Multiaddr]:
        """Advertised addresses worth giving to other machines: link-local ones are dropped, and
        loopback ones when there is anything else (a peer dialing our 127.0.0.1 would reach itself)."""
        return shareable(self.addrs)

    def addrs_for(self, via: Multiaddr | None) -> list[Multiaddr]:
        """Advertised addresses the peer at ``via`` can use (``addresses.for_peer``: loopback ones
        only to a peer on our loopback, link-local ones never)."""
        return for_peer(self.addrs, via)

    def full_addrs(self) -> list[Multiaddr]:
        """Advertised addresses with our /p2p/ID appended: what to give to someone who wants to dial us."""
        return [addr.with_peer_id(self.peer_id) for addr in self.addrs]

    async def listen(self, addr: Multiaddr | str) -> list[Multiaddr]:
        """Start listening on ``addr``; returns the bound addresses (real port for /tcp/0)."""
        addr = Multiaddr(addr)
        transport = self._transport_for(addr, listening=True)
        try:
            bound = await self._running_nursery().start(transport.listen, addr, self.handle_inbound)
        except* OSError as group:
            exc: OSError | BaseExceptionGroup[OSError] = group.exceptions[0]
            while isinstance(exc, BaseExceptionGroup):  # a transport may nest its own group
                exc = exc.exceptions[0]
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ListenError(f"cannot listen on {addr}: {reason}") from None
        self.listen_addrs.extend(bound)
        self.events.publish(ListenAddrsChanged(tuple(self.listen_addrs)))
        return bound

    def add_transport(self, transport: Transport) -> None:
        """Dial (and listen) through ``transport`` too (the relay client adds circuit dialing)."""
        if transport not in self.transports:
            self.transports.append(transport)

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
        """The best open connection to ``peer``: direct before relayed, then one whose loss costs
        no round trips before one that loses packets unrepaired (see ``Connection.loses_packets``),
        then the oldest."""
        found = self._connections.get(peer)
        if not found:
            return None
        if len(found) == 1:  # the usual case, asked on every expert call: no list built
            return None if found[0].is_closed else found[0]
        live = [c for c in found if not c.is_closed]
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        return min(live, key=lambda c: (c.path is Path.RELAYED, c.loses_packets(), c.opened_at))

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
        return await dial_staggered(self._dial_addr, peer, addrs)

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
            conn = await self._running_nursery().start(self._run_connection, raw, role, expected)
        except BaseException:
            await raw.abort()  # cancelled before the connection task owned it
            raise
        if peer is not None and conn.remote_peer != peer:
            await conn.aclose()
            raise PeerIDMismatch.between(peer, conn.remote_peer)
        return conn

    async def handle_inbound(self, raw: RawConnection) -> None:
        """Upgrade and serve a raw connection someone opened to us (transports and the relay
        stop handler call this, in a task of their own; it returns when the connection closes)."""
        for service in self._services:
            verdict = service.classify_inbound(raw)
            if verdict is not None:
                await self._run_classified(raw, verdict)
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
            await raw.abort()
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
        if raw.session is not None:
            return self._adopt_secured(raw, direction, expected_peer)
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
                # the secure channel itself, or a BufferedStream over it that kept what the
                # muxer negotiation read past its last message
                muxed_stream: trio.abc.Stream = secure
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
        muxer = YamuxConnection(muxed_stream, is_client=direction is Direction.OUTBOUND, budget=scope)
        path = Path.RELAYED if raw.remote_addr.is_relayed() else (raw.path or Path.DIRECT)
        return Connection(raw, secure, muxer, direction, path)

    def _adopt_secured(self, raw: RawConnection, direction: Direction, expected_peer: PeerID | None) -> Connection:
        """A connection its transport secured and multiplexed (QUIC): check the peer, charge the
        resource manager, and use the session as both channel and muxer."""
        session = raw.session
        assert session is not None
        session.check_expected(expected_peer)
        scope = self.resources.open_connection(session.remote_peer, raw.remote_addr, now=trio.current_time())
        if scope is None:
            raise HandshakeError(f"connection from {session.remote_peer.short()} at {raw.remote_addr} refused: resource limit")
        session.attach_scope(scope)
        return Connection(raw, session, session, direction, raw.path or Path.DIRECT)  # type: ignore[arg-type]

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

    async def _serve_stream(self, conn: Connection, inner: YamuxStream) -> None:
        try:
            with trio.fail_after(self.config.stream_negotiation_timeout):
                stream = await conn.negotiate_inbound(inner, self._handlers.__contains__)
        except (trio.TooSlowError, NegotiationError, RemoteProtocolError, trio.BrokenResourceError) as exc:
            log.debug("stream negotiation with %s failed: %s", conn.remote_peer.short(), describe(exc))
            return
        if not self._admit(inner, stream.protocol):
            # The peer's (or everyone's) inbound streams of this protocol are at their limit.
            log.debug("too many inbound %s streams from %s: refused with RST", stream.protocol, conn.remote_peer.short())
            await reset_quietly(stream)
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

    def _admit(self, inner: YamuxStream, protocol: str) -> bool:
        """Count an inbound stream against ``protocol``'s limits in the resource manager (False,
        refusal counted, past them). The muxer only knows the stream's memory budget; the
        protocol is ours to account once it is negotiated."""
        budget = inner.budget
        return not isinstance(budget, StreamScope) or budget.set_protocol(protocol, now=trio.current_time())

    # --- services and tasks ----------------------------------------------------------------------
    def _running_nursery(self) -> trio.Nursery:
        """The nursery ``open_host`` gave us; RuntimeError when the Host was built without one."""
        if self._nursery is None:
            raise RuntimeError("the host is not running (open it with open_host)")
        return self._nursery

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


@asynccontextmanager
async def open_host(
    keypair: KeyPair | None = None,
    listen: Sequence[Multiaddr | str] = (),
    *,
    transports: Sequence[Transport] = (),
    config: HostConfig | None = None,
    services: Sequence[Service] = (),
):
    """Run a Host for the duration of the ``async with`` block with exactly ``transports`` and
    ``services`` on it (and a default ResourceManager unless one is among them). The Host builds
    no transport of its own: nodes that want the standard ones (TCP, memory, QUIC) and the
    standard services open their Host with ``volunteer.net.stack.open_stack`` instead."""
    config = config or HostConfig()
    host = Host(keypair or KeyPair.generate(), transports, config, services)
    async with trio.open_nursery() as nursery:
        host._nursery = nursery
        try:
            for service in host.services:
                await host._start_service(service)
            for addr in listen:
                await host.listen(addr)
            yield host
        finally:
            await host.aclose()


def install_resource_manager(services: list[Service], config: HostConfig) -> ResourceManager:
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
