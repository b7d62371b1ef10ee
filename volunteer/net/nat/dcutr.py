"""DCUtR (`/libp2p/dcutr`): turn a relayed connection into a direct, hole-punched one. The driver.

The peer that received the relayed connection (B) opens a dcutr stream and sends CONNECT with its
observed addresses; the other (A) answers CONNECT with its own; B measures the round trip, sends
SYNC and waits half of it; A acts as soon as SYNC arrives. Over TCP both dial from their listen
ports, so their SYNs cross in the NATs' mappings (a TCP simultaneous open; a SYN refused by a
router that RSTs unsolicited ones is sent again 50 ms later). Over QUIC the upgrade's client
dials from the shared UDP socket while the server sends random packets from it toward the
client's address until the dial arrives. Both transports are tried at once and the first direct
connection wins. Every decision (attempts, roles, addresses, when and how long to punch, the
outcome) is ``punch``'s; the messages are ``messages``'; this module only moves bytes, sleeps and
dials. On success the Host prefers the direct connection and B closes the relayed one after a
grace period; on failure the relayed connection simply stays, and is punched again when our
addresses or reachability change.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypedDict, TypeGuard

import trio

from ...errors import RemoteProtocolError, VolunteerError, describe
from .. import limits
from ..addresses import for_peer, scope_of, usable_across
from ..connection import Connection
from ..events import DirectConnectionUp, ObservedAddrChanged, PortMappingChanged, ReachabilityChanged, RelayedConnectionUp
from ..identity import PeerID
from ..interfaces import is_global_v6
from ..multiaddr import Multiaddr
from ..service import BaseService, Handler, HostAPI, InboundClass
from ..streams import BufferedStream, close_quietly
from ..transport.base import Direction, Path, RawConnection
from ..transport.quic import QuicTransport
from ..transport.tcp import NO_LISTEN_PORT
from . import messages
from .messages import CONNECT, SYNC, PunchMessage, punch_candidates, punch_transport, punchable
from .birthday import EASY, BirthdayStep, birthday_step
from .observed import endpoint_of, port_kept_guess
from .observer import AddressObserver
from .portmap import PortMapper
from .prober import open_hard_sockets, spray_probes
from .punch import DIRECT, FAILED, REVERSED, PunchOutcome, PunchPlan, PunchStep, attempt_roles, punch_gaps, should_repunch

log = logging.getLogger(__name__)

DCUTR = "/libp2p/dcutr"
MAX_ATTEMPTS = limits.DCUTR_MAX_ATTEMPTS


async def read(stream: BufferedStream, expected: int) -> PunchMessage:
    """Read one HolePunch of type ``expected`` (RemoteProtocolError otherwise, or at EOF)."""
    body = await stream.receive_length_prefixed(limits.DCUTR_MAX_MESSAGE, "dcutr message")
    return messages.decode(body, expected)



class PunchingStatus(TypedDict):
    """``HolePuncher.snapshot()``: attempts by transport and result, and how punches ended."""

    attempts: dict[str, dict[str, int]]
    punches: int
    direct: int
    by_transport: dict[str, int]
    reversed: int
    failed: int
    first_attempt: int
    time_to_direct_ms_p50: float | None
    in_progress: int


class HolePuncher(BaseService):
    """Runs DCUtR on a Host: initiates on inbound relayed connections, answers on the others."""

    def __init__(self, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.max_attempts = max_attempts
        self.outcomes: list[PunchOutcome] = []
        self._slots = trio.Semaphore(limits.DCUTR_MAX_CONCURRENT_PUNCHES)
        # Addresses whose inbound connection is the punch we expect from that peer, and the role
        # we keep on it (see classify_inbound).
        self._expected: dict[Multiaddr, tuple[PeerID, Direction]] = {}
        # The same, by IP, for TCP as the upgrade's client: a peer behind a symmetric NAT dialling
        # our router's port mapping reaches us from a port nobody told us (its NAT picked it anew).
        self._expected_tcp_ips: dict[str, tuple[PeerID, Direction]] = {}
        self._punching: set[PeerID] = set()
        self._last_try: dict[PeerID, float] = {}
        # every attempt, by transport and result (both sides count theirs): see snapshot()
        self.tally: dict[str, dict[str, int]] = {}
        self.observer: AddressObserver | None = None
        self._probing: set[str] = set()  # IPs we send birthday probes to (their dials are punches)
        self.birthday_probes: dict[str, int] = {}  # birthday probes we took part in, by our role

    def handlers(self) -> dict[str, Handler]:
        return {DCUTR: self.handle}

    def classify_inbound(self, raw: RawConnection) -> InboundClass | None:
        """Our punch's SYN may lose the race to the peer's and reach our listener instead: the same
        connection, and we keep the role we chose (DCUtR: the puncher B is the upgrade's client).
        Over QUIC the peer's dial reaching our socket is the punch itself (roles are QUIC's)."""
        expected = self._expected.get(raw.remote_addr)
        if expected is None:
            found = endpoint_of(raw.remote_addr)
            if found is not None and found[0] == "quic" and found[1] in self._probing:
                # a birthday probe's dial: from one of the hard side's many ports, any of which may win
                return InboundClass(role=Direction.INBOUND, path=Path.HOLE_PUNCHED)
            if found is not None and found[0] == "tcp":
                expected = self._expected_tcp_ips.get(found[1])
            if expected is None:
                return None
        peer, role = expected
        return InboundClass(role=role, expected_peer=peer, path=Path.HOLE_PUNCHED)

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        observer = host.service(AddressObserver)
        if observer is None:
            observer = AddressObserver()
            await host.add_service(observer)
        self.observer = observer
        kinds = (RelayedConnectionUp, ObservedAddrChanged, ReachabilityChanged)
        with host.events.subscribe(*kinds, max_queued=limits.MAX_CONNECTIONS) as events:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for event in events:
                    if isinstance(event, RelayedConnectionUp):
                        if event.connection.direction is Direction.INBOUND:
                            nursery.start_soon(self.initiate, event.connection)
                    else:
                        # our addresses or reachability changed: what failed before may work now
                        for relayed in self._relayed_to_repunch(trio.current_time()):
                            nursery.start_soon(self.initiate, relayed)

    def _relayed_to_repunch(self, now: float) -> list[Connection]:
        chosen: list[Connection] = []
        for conn in self.host.connections():
            peer = conn.remote_peer
            if conn.path is not Path.RELAYED or conn.direction is not Direction.INBOUND or conn.is_closed:
                continue
            if any(c is conn or c.remote_peer == peer for c in chosen):
                continue
            if should_repunch(self._last_try.get(peer), now, punching=peer in self._punching,
                              has_direct=_is_direct(self.host.connection_to(peer))):
                chosen.append(conn)
        return chosen

    def our_addrs(self, peer_addrs: Sequence[Multiaddr] = (), via: Multiaddr | None = None) -> list[Multiaddr]:
        """What we tell the other side to dial, at most DCUTR_MAX_PUNCH_ADDRS per transport:
        our LAN addresses first when the peer shares our public address (``same_lan``: a router
        without hairpinning refuses our public address from inside, and Tailscale and iroh offer
        LAN endpoints first too), router mappings an AutoNAT server reached (the peer's dial
        simply gets in), our global IPv6 addresses (no NAT: they are their own external address;
        a stateful firewall is punched as a NAT is), then the observed external addresses of our
        TCP and QUIC ports (QUIC's guessed from TCP's while none is observed:
        ``port_kept_guess``). Only those usable across ``via`` (the relayed connection's address:
        never our loopback to a peer off our machine, never link-local)."""
        mapper = self.host.service(PortMapper)
        mapped = mapper.advertised_addrs() if mapper is not None else []
        direct = [a for a in self.host.addrs if not a.is_relayed()]
        ipv6 = [a for a in direct if is_global_v6(a.value_at(0))]
        observed = self.observer.external_addrs(trio.current_time()) if self.observer else []
        # our own interfaces' addresses (behind the router: its LAN's, whatever their range)
        lan = [a for a in direct if a not in observed] if same_lan(observed, peer_addrs) else []
        guessed = port_kept_guess(observed, self.host.listen_addrs)
        return punch_candidates(for_peer([*lan, *mapped, *ipv6, *observed, *guessed], via))

    def snapshot(self) -> PunchingStatus:
        """Punch attempts by transport and result, and how punches ended (for status and metrics)."""
        finished = self.outcomes
        times = sorted(o.seconds for o in finished if o.success)
        return {
            "attempts": {transport: dict(results) for transport, results in self.tally.items()},
            "punches": len(finished),
            "direct": sum(1 for o in finished if o.success),
            "by_transport": {t: sum(1 for o in finished if o.success and o.transport == t) for t in ("quic", "tcp")},
            "reversed": sum(1 for o in finished if o.result == REVERSED),
            "failed": sum(1 for o in finished if not o.success),
            "first_attempt": sum(1 for o in finished if o.success and o.attempts == 1),
            "time_to_direct_ms_p50": round(times[len(times) // 2] * 1000, 1) if times else None,
            "in_progress": len(self._punching),
        }

    def _record(self, outcome: PunchOutcome) -> None:
        self.outcomes.append(outcome)
        del self.outcomes[: -limits.DCUTR_MAX_OUTCOMES]

    def _count(self, plan: PunchPlan, step: PunchStep, winner: Connection | None, ours: bool) -> None:
        tried = sorted({t for a in step.addrs if (t := punch_transport(a)) is not None})
        if winner is None:
            plan.attempt_ended(tried, None, FAILED)
        else:
            plan.attempt_ended(tried, winner.transport, DIRECT if ours else REVERSED)
        for transport, results in plan.tally.items():
            mine = self.tally.setdefault(transport, {})
            for result, count in results.items():
                mine[result] = mine.get(result, 0) + count
        plan.tally.clear()

    async def initiate(self, relayed: Connection) -> PunchOutcome:
        """We are B: the relayed connection came to us. Try to punch a direct one."""
        peer = relayed.remote_peer
        plan = PunchPlan(str(peer), started_at=trio.current_time(), initiator=True, max_attempts=self.max_attempts)
        if peer in self._punching:
            return plan.failed("a punch with this peer is already running", trio.current_time())
        self._punching.add(peer)
        self._last_try[peer] = trio.current_time()
        try:
            return await self._initiate(relayed, plan)
        finally:
            self._punching.discard(peer)
            self._last_try[peer] = trio.current_time()
            while len(self._last_try) > limits.MAX_CONNECTIONS:
                self._last_try.pop(next(iter(self._last_try)))

    async def _initiate(self, relayed: Connection, plan: PunchPlan) -> PunchOutcome:
        peer = relayed.remote_peer
        async with self._slots:
            # Let identify run first: its observed addresses are what we send.
            await trio.sleep(0)
            try:
                with trio.fail_after(limits.DCUTR_STREAM_TIMEOUT * self.max_attempts):
                    stream = BufferedStream(await relayed.new_stream([DCUTR]))
                    try:
                        await self._await_observed_addrs()
                        # what we know of the peer's addresses: identify's, then its CONNECT's
                        via = relayed.remote_addr
                        known: Sequence[Multiaddr] = self.host.peerstore.addrs(peer)
                        while plan.attempts_left:
                            arrived = self.host.connection_to(peer)
                            if _is_direct(arrived):  # the peer's dial came in after our last attempt's end
                                plan.succeeded(trio.current_time(), arrived.transport, REVERSED)
                                break
                            plan.connect_sent(trio.current_time())
                            offered = self.our_addrs(known, via)
                            await stream.send_all(messages.encode(CONNECT, offered))
                            reply, pinged = await self._reply_and_ping(stream, relayed)
                            known = for_peer(reply.addrs, via)
                            step = plan.connect_received(known, trio.current_time(), pinged=pinged)
                            with self._expecting(peer, step.addrs, step.role):
                                await stream.send_all(messages.encode(SYNC))
                                if not step.addrs and not offered:
                                    continue  # neither side can dial: the next attempt may know more
                                if not step.addrs:
                                    # nothing of theirs to dial, but they dial ours now: their
                                    # connection is this attempt (a next CONNECT sent at once
                                    # would burn the attempts while their dial is on its way)
                                    direct, ours = await self._their_dial(peer, step.dial_at + step.budget), False
                                else:
                                    await trio.sleep_until(step.dial_at)
                                    direct, ours = await self._punch(peer, step)
                            self._count(plan, step, direct, ours)
                            if direct is not None:
                                plan.succeeded(trio.current_time(), direct.transport, DIRECT if ours else REVERSED)
                    finally:
                        await close_quietly(stream)
            except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                plan.outcome.error = describe(exc)
                arrived = self.host.connection_to(peer)
                if _is_direct(arrived):  # the peer closed the stream because its dial had won
                    plan.succeeded(trio.current_time(), arrived.transport, REVERSED)
        outcome = plan.finish(trio.current_time())
        self._record(outcome)
        log.info("hole punch with %s: %s after %d attempt(s)", peer.short(),
                 "direct" if outcome.success else f"stays relayed ({outcome.error})", outcome.attempts)
        if outcome.success:
            await trio.sleep(limits.DCUTR_RELAY_GRACE)
            await relayed.aclose()
        return outcome

    async def _reply_and_ping(self, stream: BufferedStream, relayed: Connection) -> tuple[PunchMessage, float | None]:
        """A's CONNECT reply, and the round trip of a muxer ping sent on the relayed connection
        beside it (None when it has not come back by the reply, or the muxer cannot ping)."""
        pinged: list[float] = []

        async def ping() -> None:
            try:
                pinged.append(await relayed.muxer.ping())
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the reply alone then measures the round trip, as the spec has it

        failed: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ping)
            try:
                reply = await read(stream, CONNECT)
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                failed = exc  # raised below, as itself rather than inside the nursery's group
            # no wait for a pong still out: sent after our CONNECT, it would measure no less
            # than the reply did
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return reply, pinged[0] if pinged else None

    async def handle(self, stream) -> None:
        """We are A: the peer we reached through a relay asks to punch."""
        buffered = BufferedStream(stream)
        peer = stream.remote_peer
        plan = PunchPlan(str(peer), started_at=trio.current_time(), initiator=False, max_attempts=self.max_attempts)
        via = stream.connection.remote_addr
        await self._await_observed_addrs()
        try:
            while plan.attempts_left:
                try:
                    # the next CONNECT comes within one attempt's bounded punch, far inside this
                    with trio.fail_after(limits.DCUTR_STREAM_TIMEOUT):
                        request = await read(buffered, CONNECT)
                        theirs = for_peer(request.addrs, via)  # never a dial to another machine's loopback
                        offered = self.our_addrs(theirs, via)
                        plan.peer_connect(theirs, trio.current_time(), offered=bool(offered))
                        with self._expecting(peer, theirs, plan.responder_role()):
                            await buffered.send_all(messages.encode(CONNECT, offered))
                            await read(buffered, SYNC)
                            step = plan.sync_received(trio.current_time())
                            direct, ours = (await self._punch(peer, step)) if step.addrs else (None, False)
                except (RemoteProtocolError, trio.TooSlowError):
                    return  # B closed the stream (done, or gave up) or broke the protocol
                if step.addrs:
                    self._count(plan, step, direct, ours)
                if direct is not None:
                    plan.succeeded(trio.current_time(), direct.transport, DIRECT if ours else REVERSED)
        finally:
            if plan.attempt:
                self._record(plan.finish(trio.current_time()))

    async def _await_observed_addrs(self) -> None:
        """Identify with the relay may still be in flight: give our observed addresses a moment
        (DCUTR_OBSERVATION_WAIT), woken by the observer's news and PortMappingChanged, until
        every transport we listen on has one (a QUIC observation comes from a connection of its
        own), and a router mapping being dialled back by AutoNAT has its answer. Only for what
        can still come (``observation_pending``): no wait at all when nothing can arrive."""
        assert self.observer is not None
        with self.host.events.subscribe(PortMappingChanged) as changes, trio.move_on_after(limits.DCUTR_OBSERVATION_WAIT):
            while True:
                moved = self.observer.moved()  # before looking: news between the two is not lost
                if not self.observation_pending():
                    break
                async with trio.open_nursery() as nursery:

                    async def mapping_news() -> None:
                        await changes.receive()
                        nursery.cancel_scope.cancel()

                    async def observer_news() -> None:
                        await moved.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(mapping_news)
                    nursery.start_soon(observer_news)

    def observation_pending(self) -> bool:
        """Whether waiting can improve what we offer: a router mapping awaits an AutoNAT
        server's dial-back that can happen now, or a transport we listen on has no observed
        address yet and one can still arrive (``AddressObserver.awaiting``: an observation dial
        or an identify in flight). A transport nothing can be observed for (UDP dropped: no QUIC
        connection ever comes up) is no reason to wait."""
        assert self.observer is not None
        mapper = self.host.service(PortMapper)
        if mapper is not None and mapper.confirming:
            return True
        now = trio.current_time()
        missing = self.observer.observed.missing(now, self.host.listen_addrs)
        if not self.our_addrs():
            missing |= {"tcp", "quic"}
        return any(self.observer.awaiting(transport, now) for transport in missing)

    @contextmanager
    def _expecting(self, peer: PeerID, addrs: Sequence[Multiaddr], role: Direction) -> Iterator[None]:
        """While we punch, an inbound connection from one of ``addrs`` is this punch
        (``classify_inbound``): over TCP only when we are the upgrade's client (as its server, a
        plain inbound connection is what we expect anyway), and then from any port of their IPs
        (a symmetric NAT's new port, dialling our port mapping); over QUIC always."""
        registered = [
            addr for addr in addrs
            if addr not in self._expected and (role is Direction.OUTBOUND or punch_transport(addr) == "quic")
        ]
        for addr in registered:
            self._expected[addr] = (peer, role)
        ips: list[str] = []
        if role is Direction.OUTBOUND:
            for addr in addrs:
                found = endpoint_of(addr)
                if found is not None and found[0] == "tcp" and found[1] not in self._expected_tcp_ips:
                    self._expected_tcp_ips[found[1]] = (peer, role)
                    ips.append(found[1])
        try:
            yield
        finally:
            for addr in registered:
                self._expected.pop(addr, None)
            for ip in ips:
                self._expected_tcp_ips.pop(ip, None)

    async def _their_dial(self, peer: PeerID, deadline: float) -> Connection | None:
        """The peer's direct connection to us, if one comes up by ``deadline``."""
        with self.host.events.subscribe(DirectConnectionUp) as direct_ups, trio.move_on_at(deadline):
            existing = self.host.connection_to(peer)
            if _is_direct(existing):
                return existing
            async for event in direct_ups:
                if isinstance(event, DirectConnectionUp) and event.peer == peer:
                    return event.connection
        return None

    async def _punch(self, peer: PeerID, step: PunchStep) -> tuple[Connection | None, bool]:
        """Punch every address at once, within the step's budget: TCP by dialling from our listen
        port, QUIC by dialling (as the client) or by sending punch packets (as the server). When
        that fails, a birthday probe over UDP follows, from the same moment on both sides: the
        longest budget after the punch's start (each side sized its own budget from the round trip
        it measured, and the two differ; a hard side opening its sockets after the easy side's
        probes have gone out finds nothing). The first direct connection wins, ours or one the
        peer opened to us (DirectConnectionUp). Returns it (or None) and whether it was our own dial."""
        winner: list[tuple[Connection, bool]] = []
        quic = self.host.service(QuicTransport)
        started = trio.current_time()
        birthday_at = started + limits.DCUTR_MAX_PUNCH
        with self.host.events.subscribe(DirectConnectionUp) as direct_ups:
            async with trio.open_nursery() as nursery:

                def won(conn: Connection, ours: bool) -> None:
                    if not winner:
                        winner.append((conn, ours))
                    nursery.cancel_scope.cancel()

                async def watch() -> None:
                    existing = self.host.connection_to(peer)
                    if _is_direct(existing):
                        won(existing, False)
                        return
                    async for event in direct_ups:
                        if isinstance(event, DirectConnectionUp) and event.peer == peer:
                            conn = event.connection
                            # as QUIC's server we wait for the peer's dial: that one is ours too
                            # (and, probing a hard NAT, for the hard side's dial through a probed port)
                            found = endpoint_of(conn.remote_addr)
                            probed = found is not None and found[1] in self._probing
                            expected = conn.transport == "quic" and (step.role is Direction.INBOUND or probed)
                            won(conn, conn.direction is Direction.OUTBOUND or expected)
                            return

                async def phases() -> None:
                    with trio.move_on_at(started + step.budget):
                        await self._ordinary_punch(peer, step, quic, won)
                    await self._birthday(peer, step, quic, won, birthday_at)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                nursery.start_soon(phases)
        return winner[0] if winner else (None, False)

    async def _ordinary_punch(self, peer: PeerID, step: PunchStep, quic: QuicTransport | None, won) -> None:
        async def dial(addr: Multiaddr, options: dict) -> None:
            try:
                conn = await self.host.dial_addr(addr, peer, role=step.role, path=Path.HOLE_PUNCHED, **options)
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                if punch_transport(addr) == "tcp" and tuple_taken(exc):
                    # The peer's SYN reached our listener before ours left: our socket's 4-tuple is
                    # that connection's, and it is this punch (``classify_inbound`` keeps our role
                    # while we expect it). Its upgrade is still running: ending the attempt now
                    # would drop the expectation under it (both sides then answer as the upgrade's
                    # server, and the punch fails). watch() sees it come up; the budget bounds the wait.
                    log.debug("punch to %s: the peer's connection got here first; waiting for it", addr)
                    await trio.sleep_forever()
                log.debug("punch to %s failed: %s", addr, describe(exc))
                return
            won(conn, True)

        async def spray(addr: Multiaddr) -> None:
            # random packets from the shared socket open our NAT toward the peer's dial
            for gap in punch_gaps(random.random(), step.budget):
                if quic is None or not quic.punch(addr):
                    return
                await trio.sleep(gap)

        async with trio.open_nursery() as nursery:
            for addr in step.addrs:
                transport = punch_transport(addr)
                if transport == "tcp":
                    # From our listen port only: any other port has no NAT mapping to punch.
                    nursery.start_soon(dial, addr, {"reuse_port_only": True, "redial_refused_for": step.budget})
                elif transport == "quic" and step.role is Direction.OUTBOUND:
                    nursery.start_soon(dial, addr, {"reuse_port_only": True})
                elif transport == "quic":
                    nursery.start_soon(spray, addr)

    async def _birthday(self, peer: PeerID, step: PunchStep, quic: QuicTransport | None, won, start_at: float) -> None:
        """One birthday probe (``birthday``) from ``start_at``, when our NAT and the peer's
        addresses call for one (without, the attempt ends now)."""
        if quic is None or self.observer is None or quic.endpoint_for(socket.AF_INET) is None:
            return
        plan = birthday_step(self.observer.udp_role(trio.current_time()), step.addrs, random.Random())
        if plan is None:
            return
        await trio.sleep_until(start_at)
        self.birthday_probes[plan.role] = self.birthday_probes.get(plan.role, 0) + 1
        with trio.move_on_after(plan.budget):
            # UNSURE (one observer saw a changed port): the hard side's part and the easy side's
            # at once; whichever meets the peer's wins (won() ends the whole punch)
            async with trio.open_nursery() as nursery:
                for part in plan.parts():
                    nursery.start_soon(self._birthday_part, peer, part, quic, won)

    async def _birthday_part(self, peer: PeerID, plan: BirthdayStep, quic: QuicTransport, won) -> None:
        if plan.role == EASY:
            self._probing.add(plan.target_ip)
            try:
                await spray_probes(quic, plan)
                await trio.sleep_forever()  # the hard side dials us: watch() sees it arrive
            finally:
                self._probing.discard(plan.target_ip)
        sock = await open_hard_sockets(plan)
        if sock is None:
            return
        try:
            conn = await self.host.dial_addr(plan.target, peer, path=Path.HOLE_PUNCHED, udp_socket=sock)
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.info("birthday probe: QUIC dial through %s failed: %s", plan.target, describe(exc))
            return
        won(conn, True)


def same_lan(ours: Sequence[Multiaddr], theirs: Sequence[Multiaddr]) -> bool:
    """Whether the peer's addresses name one of our observed external IPs: then it is behind
    our own router, and our LAN addresses are the ones it can dial. (Relayed addresses name
    their relay's IP, which is nobody's external one.)"""
    ips = {a.value_at(0) for a in ours if usable_across(a, None) and not a.is_relayed()}
    return any(not a.is_relayed() and scope_of(a) is not None and a.value_at(0) in ips for a in theirs)


def tuple_taken(exc: BaseException) -> bool:
    """Whether a dial from our listen port failed because its 4-tuple is in use
    (EADDRNOTAVAIL from connect: a connection from that address to that port exists already,
    i.e. the peer's SYN reached our listener first), looking through DialError's cause."""
    seen: BaseException | None = exc
    for _ in range(4):  # DialError -> OSError; bounded, never a cycle
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno == errno.EADDRNOTAVAIL and seen.strerror != NO_LISTEN_PORT:
            return True
        seen = seen.__cause__
    return False


def _is_direct(conn: Connection | None) -> TypeGuard[Connection]:
    return conn is not None and conn.path is not Path.RELAYED


__all__ = ["DCUTR", "HolePuncher", "PunchOutcome", "attempt_roles", "punchable", "read", "same_lan", "tuple_taken"]
