"""DCUtR (`/libp2p/dcutr`): turn a relayed connection into a direct, hole-punched one. The driver.

The peer that received the relayed connection (B) opens a dcutr stream and sends CONNECT with its
observed addresses; the other (A) answers CONNECT with its own; B measures the round trip, sends
SYNC and waits half of it; A dials as soon as SYNC arrives. Both dial from their listen ports, so
their SYNs cross in the NATs' mappings: a TCP simultaneous open. Every decision (attempts, roles,
addresses, when to dial, the outcome) is ``punch.PunchPlan``'s; the messages are ``messages``';
this module only moves bytes, sleeps and dials. On success the Host prefers the direct connection
and B closes the relayed one after a grace period; on failure the relayed connection simply stays.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeGuard

import trio

from ...errors import RemoteProtocolError, VolunteerError, describe
from .. import limits
from ..connection import Connection
from ..events import DirectConnectionUp, ObservedAddrChanged, RelayedConnectionUp
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..service import BaseService, Handler, HostAPI, InboundClass
from ..streams import BufferedStream, close_quietly
from ..transport.base import Direction, Path, RawConnection
from . import messages
from .messages import CONNECT, SYNC, PunchMessage, punchable
from .observer import AddressObserver
from .punch import PunchOutcome, PunchPlan, PunchStep, attempt_roles

log = logging.getLogger(__name__)

DCUTR = "/libp2p/dcutr"
MAX_ATTEMPTS = limits.DCUTR_MAX_ATTEMPTS


async def read(stream: BufferedStream, expected: int) -> PunchMessage:
    """Read one HolePunch of type ``expected`` (RemoteProtocolError otherwise, or at EOF)."""
    body = await stream.receive_length_prefixed(limits.DCUTR_MAX_MESSAGE, "dcutr message")
    return messages.decode(body, expected)


class HolePuncher(BaseService):
    """Runs DCUtR on a Host: initiates on inbound relayed connections, answers on the others."""

    def __init__(self, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.max_attempts = max_attempts
        self.outcomes: list[PunchOutcome] = []
        self._slots = trio.Semaphore(limits.DCUTR_MAX_CONCURRENT_PUNCHES)
        # Addresses whose inbound connection is the punch we expect from that peer (see classify_inbound).
        self._expected: dict[Multiaddr, PeerID] = {}
        self.observer: AddressObserver | None = None

    def handlers(self) -> dict[str, Handler]:
        return {DCUTR: self.handle}

    def classify_inbound(self, raw: RawConnection) -> InboundClass | None:
        """Our punch's SYN may lose the race to the peer's and reach our listener instead: the same
        connection, and we keep the role we chose (DCUtR: the puncher B is the upgrade's client)."""
        peer = self._expected.get(raw.remote_addr)
        if peer is None:
            return None
        return InboundClass(role=Direction.OUTBOUND, expected_peer=peer, path=Path.HOLE_PUNCHED)

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        observer = host.service(AddressObserver)
        if observer is None:
            observer = AddressObserver()
            await host.add_service(observer)
        self.observer = observer
        with host.events.subscribe(RelayedConnectionUp, max_queued=limits.MAX_CONNECTIONS) as events:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for event in events:
                    assert isinstance(event, RelayedConnectionUp)
                    if event.connection.direction is Direction.INBOUND:
                        nursery.start_soon(self.initiate, event.connection)

    def our_addrs(self) -> list[Multiaddr]:
        """What we tell the other side to dial: observed external addresses of our listen port."""
        return self.observer.external_addrs(trio.current_time()) if self.observer else []

    async def initiate(self, relayed: Connection) -> PunchOutcome:
        """We are B: the relayed connection came to us. Try to punch a direct one."""
        peer = relayed.remote_peer
        plan = PunchPlan(str(peer), started_at=trio.current_time(), initiator=True, max_attempts=self.max_attempts)
        async with self._slots:
            # Let identify run first: its observed addresses are what we send.
            await trio.sleep(0)
            try:
                with trio.fail_after(limits.DCUTR_STREAM_TIMEOUT * self.max_attempts):
                    stream = BufferedStream(await relayed.new_stream([DCUTR]))
                    try:
                        await self._await_observed_addrs()
                        while plan.attempts_left:
                            plan.connect_sent(trio.current_time())
                            await stream.send_all(messages.encode(CONNECT, self.our_addrs()))
                            reply = await read(stream, CONNECT)
                            step = plan.connect_received(reply.addrs, trio.current_time())
                            with self._expecting(peer, step.addrs, step.role):
                                await stream.send_all(messages.encode(SYNC))
                                if not step.addrs:
                                    continue
                                await trio.sleep_until(step.dial_at)
                                direct = await self._punch(peer, step)
                            if direct is not None:
                                plan.succeeded(trio.current_time())
                    finally:
                        await close_quietly(stream)
            except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                plan.outcome.error = describe(exc)
        outcome = plan.finish(trio.current_time())
        self.outcomes.append(outcome)
        del self.outcomes[: -limits.DCUTR_MAX_OUTCOMES]
        log.info("hole punch with %s: %s after %d attempt(s)", peer.short(),
                 "direct" if outcome.success else f"stays relayed ({outcome.error})", outcome.attempts)
        if outcome.success:
            await trio.sleep(limits.DCUTR_RELAY_GRACE)
            await relayed.aclose()
        return outcome

    async def handle(self, stream) -> None:
        """We are A: the peer we reached through a relay asks to punch."""
        buffered = BufferedStream(stream)
        peer = stream.remote_peer
        plan = PunchPlan(str(peer), started_at=trio.current_time(), initiator=False, max_attempts=self.max_attempts)
        await self._await_observed_addrs()
        while plan.attempts_left:
            try:
                with trio.fail_after(limits.DCUTR_STREAM_TIMEOUT):
                    request = await read(buffered, CONNECT)
                    attempt = plan.peer_connect(request.addrs)
                    with self._expecting(peer, request.addrs, plan.our_role(attempt)):
                        await buffered.send_all(messages.encode(CONNECT, self.our_addrs()))
                        await read(buffered, SYNC)
                        step = plan.sync_received(trio.current_time())
                        punched = bool(step.addrs) and await self._punch(peer, step) is not None
            except (RemoteProtocolError, trio.TooSlowError):
                return  # B closed the stream (done, or gave up) or broke the protocol
            if punched:
                plan.succeeded(trio.current_time())

    async def _await_observed_addrs(self) -> None:
        """Identify with the relay may still be in flight: give our observed address a moment
        (DCUTR_OBSERVATION_WAIT), woken by the observer's ObservedAddrChanged."""
        with self.host.events.subscribe(ObservedAddrChanged) as changes, trio.move_on_after(limits.DCUTR_OBSERVATION_WAIT):
            while not self.our_addrs():
                await changes.receive()

    @contextmanager
    def _expecting(self, peer: PeerID, addrs: Sequence[Multiaddr], role: Direction) -> Iterator[None]:
        """While we punch as the upgrade's client, an inbound connection from one of ``addrs`` is
        this punch (``classify_inbound``)."""
        registered = [addr for addr in addrs if role is Direction.OUTBOUND and addr not in self._expected]
        for addr in registered:
            self._expected[addr] = peer
        try:
            yield
        finally:
            for addr in registered:
                self._expected.pop(addr, None)

    async def _punch(self, peer: PeerID, step: PunchStep) -> Connection | None:
        """Dial every address at once from our listen port; the first direct connection wins,
        whether ours or the one the peer's SYN opened on our listener (DirectConnectionUp)."""
        winner: list[Connection] = []
        budget = limits.DCUTR_DIAL_TIMEOUT + self.host.config.handshake_timeout
        with self.host.events.subscribe(DirectConnectionUp) as direct_ups, trio.move_on_after(budget):
            async with trio.open_nursery() as nursery:

                async def dial(addr: Multiaddr) -> None:
                    try:
                        # From our listen port only: any other port has no NAT mapping to punch.
                        conn = await self.host.dial_addr(addr, peer, role=step.role, path=Path.HOLE_PUNCHED, reuse_port_only=True)
                    except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                        log.debug("punch to %s failed: %s", addr, describe(exc))
                        return
                    winner.append(conn)
                    nursery.cancel_scope.cancel()

                async def watch() -> None:
                    existing = self.host.connection_to(peer)
                    if _is_direct(existing):
                        winner.append(existing)
                        nursery.cancel_scope.cancel()
                        return
                    async for event in direct_ups:
                        if isinstance(event, DirectConnectionUp) and event.peer == peer:
                            winner.append(event.connection)
                            nursery.cancel_scope.cancel()
                            return

                nursery.start_soon(watch)
                for addr in step.addrs:
                    nursery.start_soon(dial, addr)
        return winner[0] if winner else None


def _is_direct(conn: Connection | None) -> TypeGuard[Connection]:
    return conn is not None and conn.path is not Path.RELAYED


__all__ = ["DCUTR", "HolePuncher", "PunchOutcome", "attempt_roles", "punchable", "read"]
