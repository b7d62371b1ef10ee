"""The client side of circuit relay v2: reserve slots, accept relayed connections, dial through relays.

A NATed volunteer reserves a slot on one or more relays and advertises
``<relay addr>/p2p/RELAY/p2p-circuit``; others dial ``…/p2p-circuit/p2p/US``. The relay opens a
stop stream to us and splices it to the dialer's hop stream; Noise and yamux then run end to end
over that pair of streams, so the relay only ever sees ciphertext.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from ...errors import DialError, RemoteProtocolError, VolunteerError, describe
from ..connection import Path
from ..events import PeerDisconnected
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..streams import BufferedStream, close_quietly, reset_quietly
from ..transport.base import RawConnection
from . import circuit
from .circuit import HopMessage, Limit, StopMessage

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0
MAX_RESERVATION_TTL = 24 * 3600.0  # we never trust a relay's expiry further out than this
CLOCK_SKEW_ALLOWANCE = 30.0  # relays' clocks disagree with ours; refresh this much early
MIN_REFRESH = 5.0


@dataclass
class Reservation:
    """A slot on a relay, as the relay granted it."""

    relay: PeerID
    relay_addrs: list[Multiaddr]  # the relay's addresses, ending in /p2p/RELAY
    expire_unix: int
    ttl: float  # seconds from when it was granted, as we trust it (capped, skew-adjusted)
    granted_at: float  # trio clock
    limit: Limit
    voucher: bytes | None = None

    @property
    def circuit_addrs(self) -> list[Multiaddr]:
        return [addr.encapsulate("/p2p-circuit") for addr in self.relay_addrs]

    def refresh_at(self) -> float:
        """When to refresh: at 3/4 of the lifetime, and never later than skew allows."""
        return self.granted_at + max(MIN_REFRESH, min(self.ttl * 0.75, self.ttl - CLOCK_SKEW_ALLOWANCE))


async def reserve(host, relay: PeerID | Multiaddr | str, wall_clock: Callable[[], float] = time.time) -> Reservation:
    """Reserve a slot on ``relay``. DialError if refused or unreachable."""
    with trio.fail_after(REQUEST_TIMEOUT):
        conn = await host.connect(relay)
        stream = BufferedStream(await conn.new_stream([circuit.HOP]))
        try:
            await circuit.write_message(stream, HopMessage(type=HopMessage.RESERVE))
            reply = await circuit.read_message(stream, HopMessage)
        finally:
            await close_quietly(stream)
    relay_peer = conn.remote_peer
    if reply.type != HopMessage.STATUS or reply.status != circuit.OK:
        raise DialError(f"relay {relay_peer} refused the reservation: {circuit.status_name(reply.status)}")
    if not reply.HasField("reservation"):
        raise RemoteProtocolError("relay accepted the reservation but sent no details")
    details = reply.reservation
    # The relay's clock is not ours: trust its expiry only up to a bound.
    ttl = min(max(details.expire - wall_clock(), 0.0), MAX_RESERVATION_TTL)
    addrs = []
    for raw in details.addrs:
        try:
            addr = Multiaddr.from_bytes(raw)
        except VolunteerError:
            continue
        addrs.append(addr if addr.peer_id == relay_peer else addr.with_peer_id(relay_peer))
    if not addrs:
        addrs = [conn.remote_addr.with_peer_id(relay_peer)]
    voucher = details.voucher if details.HasField("voucher") else None
    if voucher:
        circuit.verify_voucher(voucher, relay_peer, host.peer_id)
    limit = Limit.from_pb(reply.limit) if reply.HasField("limit") else Limit()
    return Reservation(relay_peer, addrs, details.expire, ttl, trio.current_time(), limit, voucher)


class CircuitTransport:
    """Dials ``…/p2p/RELAY/p2p-circuit/p2p/TARGET`` through the relay's hop protocol."""

    def __init__(self, host) -> None:
        self.host = host

    def can_dial(self, addr: Multiaddr) -> bool:
        parts = addr.relay_parts()
        return parts is not None and parts[0].peer_id is not None

    def can_listen(self, addr: Multiaddr) -> bool:
        return False

    async def dial(self, addr: Multiaddr, **_options) -> RawConnection:
        relay_addr, target = addr.relay_parts()
        if target is None:
            raise DialError(f"{addr} does not name the peer to reach through the relay")
        relay_conn = await self.host.connect(relay_addr)
        stream = BufferedStream(await relay_conn.new_stream([circuit.HOP]))
        request = HopMessage(type=HopMessage.CONNECT)
        request.peer.id = target.to_bytes()
        try:
            await circuit.write_message(stream, request)
            reply = await circuit.read_message(stream, HopMessage)
        except BaseException:
            await reset_quietly(stream)
            raise
        if reply.type != HopMessage.STATUS or reply.status != circuit.OK:
            await close_quietly(stream)
            raise DialError(f"relay {relay_conn.remote_peer.short()} could not connect us: {circuit.status_name(reply.status)}")
        local = relay_conn.remote_addr.with_peer_id(relay_conn.remote_peer).encapsulate("/p2p-circuit")
        remote = relay_conn.remote_addr.with_peer_id(relay_conn.remote_peer).encapsulate(f"/p2p-circuit/p2p/{target}")
        raw = RawConnection(stream, local, remote, self)
        raw.relay_peer = relay_conn.remote_peer
        raw.path = Path.RELAYED
        return raw


class StopHandler:
    """Accepts relayed connections: the relay's stop CONNECT becomes an inbound connection."""

    def __init__(self, host, transport: CircuitTransport) -> None:
        self.host = host
        self.transport = transport
        self.accepted = 0

    async def handle(self, stream) -> None:
        buffered = BufferedStream(stream)
        try:
            message = await circuit.read_message(buffered, StopMessage)
            if message.type != StopMessage.CONNECT:
                await circuit.write_message(buffered, StopMessage(type=StopMessage.STATUS, status=circuit.UNEXPECTED_MESSAGE))
                return
            source = circuit.peer_of(message)
        except RemoteProtocolError:
            await circuit.write_message(buffered, StopMessage(type=StopMessage.STATUS, status=circuit.MALFORMED_MESSAGE))
            return
        await circuit.write_message(buffered, StopMessage(type=StopMessage.STATUS, status=circuit.OK))
        relay_conn = stream.connection
        relay_addr = relay_conn.remote_addr.with_peer_id(relay_conn.remote_peer)
        raw = RawConnection(buffered, relay_addr.encapsulate("/p2p-circuit"), relay_addr.encapsulate(f"/p2p-circuit/p2p/{source}"), self.transport)
        raw.relay_peer = relay_conn.remote_peer
        raw.path = Path.RELAYED
        self.accepted += 1
        # We are the responder of the upgrade; this returns when the relayed connection closes.
        await self.host.handle_inbound(raw)


def install_relay_client(host) -> CircuitTransport:
    """Let ``host`` dial through relays and accept relayed connections."""
    for existing in host.transports:
        if isinstance(existing, CircuitTransport):
            return existing
    transport = CircuitTransport(host)
    host.transports.append(transport)
    host.set_handler(circuit.STOP, StopHandler(host, transport).handle)
    return transport


@dataclass
class RelayStatus:
    """What the dashboard shows for one relay."""

    addr: Multiaddr
    reservation: Reservation | None = None
    last_error: str = ""
    failures: int = 0
    retry_at: float = 0.0  # trio clock: no new attempt before this after a failure
    rtt: float | None = None


class ReservationManager:
    """Keeps ``want`` reservations among ``relays``: refreshes before expiry, moves to another relay
    when one goes away, backs off after failures, and advertises the circuit addresses."""

    def __init__(self, host, relays: Sequence[Multiaddr | str], want: int = 2, wall_clock: Callable[[], float] = time.time,
                 max_backoff: float = 60.0) -> None:
        self.host = host
        self.want = want
        self.wall_clock = wall_clock
        self.max_backoff = max_backoff
        self.relays = [RelayStatus(Multiaddr(addr)) for addr in relays]
        self.changed = trio.Event()
        install_relay_client(host)
        previous = host.extra_addrs
        host.extra_addrs = lambda: previous() + self.circuit_addrs()

    def circuit_addrs(self) -> list[Multiaddr]:
        return [addr for status in self.relays if status.reservation for addr in status.reservation.circuit_addrs]

    @property
    def reservations(self) -> list[Reservation]:
        return [status.reservation for status in self.relays if status.reservation]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        events = self.host.events.subscribe()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnects, events)
            task_status.started()
            while True:
                await self._maintain()
                wake = self._next_wakeup()
                with trio.move_on_at(wake):
                    await self.changed.wait()
                self.changed = trio.Event()

    async def _watch_disconnects(self, events) -> None:
        async for event in events:
            if isinstance(event, PeerDisconnected) and not self.host.connections(event.peer):
                for status in self.relays:
                    if status.reservation and status.reservation.relay == event.peer:
                        # The spec: a reservation lives only as long as our connection to the relay.
                        log.info("lost relay %s; reserving again", event.peer.short())
                        status.reservation = None
                        self.changed.set()

    def _next_wakeup(self) -> float:
        times = [s.reservation.refresh_at() for s in self.relays if s.reservation]
        times += [trio.current_time() + min(self.max_backoff, 2.0 ** s.failures) for s in self.relays if not s.reservation and s.failures]
        return min(times, default=trio.current_time() + self.max_backoff)

    async def _maintain(self) -> None:
        now = trio.current_time()
        held = [s for s in self.relays if s.reservation and s.reservation.refresh_at() > now]
        due = [s for s in self.relays if s.reservation and s.reservation.refresh_at() <= now]
        candidates = due + [s for s in self.relays if not s.reservation]
        before = self.circuit_addrs()
        for status in candidates:
            if len(held) >= self.want:
                break
            if not status.reservation and now < status.retry_at:
                continue
            try:
                status.reservation = await reserve(self.host, status.addr, self.wall_clock)
                status.failures = 0
                status.last_error = ""
                conn = self.host.connection_to(status.reservation.relay)
                status.rtt = conn.rtt if conn else None
                held.append(status)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                status.reservation = None
                status.failures += 1
                status.last_error = describe(exc)
                status.retry_at = now + min(self.max_backoff, 2.0 ** status.failures)
                log.info("reservation on %s failed: %s", status.addr, status.last_error)
        if self.circuit_addrs() != before:
            await self._announce()

    async def _announce(self) -> None:
        try:
            await self.host.push_identify()
        except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify push failed: %s", describe(exc))
