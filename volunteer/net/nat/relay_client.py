"""The client side of circuit relay v2: reserve slots, accept relayed connections, dial through relays.

A NATed volunteer reserves a slot on one or more relays and advertises
``<relay addr>/p2p/RELAY/p2p-circuit``; others dial ``…/p2p-circuit/p2p/US``. The relay opens a
stop stream to us and splices it to the dialer's hop stream; Noise and yamux then run end to end
over that pair of streams, so the relay only ever sees ciphertext.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from collections.abc import Callable, Sequence

import trio

from ...errors import DialError, RemoteProtocolError, VolunteerError, describe
from .. import limits
from ..events import PeerDisconnected, RelayReservationsChanged, Subscription
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..streams import BufferedStream, close_quietly, reset_quietly
from ..identify import identify_of
from ..service import BaseService, Handler, HostAPI
from ..transport.base import InboundHandler, Path, RawConnection
from . import circuit
from .circuit import HopMessage, Limit, StopMessage
from .schedule import RelayStatus, Reservation, ReservationSchedule

log = logging.getLogger(__name__)


async def reserve(host: HostAPI, relay: PeerID | Multiaddr | str, wall_clock: Callable[[], float] = time.time) -> Reservation:
    """Reserve a slot on ``relay``. DialError if refused or unreachable."""
    with trio.fail_after(limits.RELAY_REQUEST_TIMEOUT):
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
    ttl = min(max(details.expire - wall_clock(), 0.0), limits.MAX_RESERVATION_TTL)
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

    def __init__(self, host: HostAPI) -> None:
        self.host = host

    def can_dial(self, addr: Multiaddr) -> bool:
        parts = addr.relay_parts()
        return parts is not None and parts[0].peer_id is not None

    def can_listen(self, addr: Multiaddr) -> bool:
        return False

    async def listen(self, addr: Multiaddr, handler: InboundHandler, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Never called (``can_listen`` is False): relayed connections arrive on the stop protocol."""
        raise DialError(f"{addr}: circuit addresses are reached through a reservation, not listened on")

    async def dial(self, addr: Multiaddr, **_options: Any) -> RawConnection:
        parts = addr.relay_parts()
        if parts is None:
            raise DialError(f"{addr} is not a relayed address")
        relay_addr, target = parts
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


class RelayClient(BaseService):
    """The relay client as a Host service: dials ``…/p2p-circuit/p2p/PEER`` addresses (it adds a
    ``CircuitTransport`` to the Host) and accepts relayed connections (the stop protocol): the
    relay's stop CONNECT becomes an inbound connection we answer as the upgrade's responder."""

    def __init__(self) -> None:
        self.transport: CircuitTransport | None = None
        self.accepted = 0

    def handlers(self) -> dict[str, Handler]:
        return {circuit.STOP: self.handle_stop}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        self.transport = CircuitTransport(host)
        host.add_transport(self.transport or CircuitTransport(self.host))
        task_status.started()

    async def handle_stop(self, stream) -> None:
        """Serve one stop stream: answer the relay, then run the relayed connection on it."""
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
        raw = RawConnection(buffered, relay_addr.encapsulate("/p2p-circuit"), relay_addr.encapsulate(f"/p2p-circuit/p2p/{source}"), self.transport or CircuitTransport(self.host))
        raw.relay_peer = relay_conn.remote_peer
        raw.path = Path.RELAYED
        self.accepted += 1
        # We are the responder of the upgrade; this returns when the relayed connection closes.
        await self.host.handle_inbound(raw)


class ReservationManager(BaseService):
    """Keeps ``want`` reservations among ``relays`` (a Host service): refreshes before expiry,
    moves to another relay when one goes away, backs off after failures (every decision is the
    pure ``ReservationSchedule``'s), and advertises the circuit addresses."""

    def __init__(self, relays: Sequence[Multiaddr | str], want: int = limits.WANT_RESERVATIONS,
                 wall_clock: Callable[[], float] = time.time, max_backoff: float = limits.RESERVATION_MAX_BACKOFF) -> None:
        self.schedule = ReservationSchedule(relays, want=want, max_backoff=max_backoff)
        self.wall_clock = wall_clock
        self._changed = trio.Event()
        self._announced: list[Multiaddr] = []

    @property
    def want(self) -> int:
        return self.schedule.want

    @property
    def relays(self) -> list[RelayStatus]:
        return self.schedule.relays

    def set_want(self, want: int) -> None:
        """Keep ``want`` reservations from now on; 0 gives them all up (we turned out public: the
        relay's slots are for those who need them; they lapse there when not refreshed)."""
        self.schedule.want = want
        if want == 0:
            for status in self.schedule.relays:
                status.reservation = None
        self._changed.set()

    @property
    def reservations(self) -> list[Reservation]:
        return self.schedule.reservations

    def circuit_addrs(self) -> list[Multiaddr]:
        """The circuit addresses of the reservations we hold."""
        return self.schedule.circuit_addrs()

    def advertised_addrs(self) -> list[Multiaddr]:
        return self.circuit_addrs()

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        if host.service(RelayClient) is None:
            await host.add_service(RelayClient())  # relayed connections must reach us
        with host.events.subscribe(PeerDisconnected) as events:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_disconnects, events)
                task_status.started()
                while True:
                    await self._maintain()
                    with trio.move_on_at(self.schedule.next_wakeup(trio.current_time())):
                        await self._changed.wait()
                    self._changed = trio.Event()

    async def _watch_disconnects(self, events: Subscription) -> None:
        async for event in events:
            if isinstance(event, PeerDisconnected) and not self.host.connections(event.peer):
                # The spec: a reservation lives only as long as our connection to the relay.
                if self.schedule.on_relay_lost(event.peer):
                    log.info("lost relay %s; reserving again", event.peer.short())
                    self._changed.set()

    async def _maintain(self) -> None:
        now = trio.current_time()
        for status in self.schedule.due(now):
            if self.schedule.satisfied(now):
                break
            try:
                reservation = await reserve(self.host, status.addr, self.wall_clock)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.schedule.on_failed(status, describe(exc), now)
                log.info("reservation on %s failed: %s", status.addr, status.last_error)
                continue
            conn = self.host.connection_to(reservation.relay)
            self.schedule.on_reserved(status, reservation, conn.rtt if conn else None)
        if self.circuit_addrs() != self._announced:
            self._announced = self.circuit_addrs()
            self.host.events.publish(RelayReservationsChanged(tuple(self._announced)))
            await self._announce()

    async def _announce(self) -> None:
        try:
            await identify_of(self.host).push()
        except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("identify push failed: %s", describe(exc))


__all__ = ["CircuitTransport", "RelayClient", "RelayStatus", "Reservation", "ReservationManager", "reserve"]
