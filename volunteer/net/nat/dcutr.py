"""DCUtR (`/libp2p/dcutr`): turn a relayed connection into a direct, hole-punched one.

The peer that received the relayed connection (B) opens a dcutr stream and sends CONNECT with its
observed addresses; the other (A) answers CONNECT with its own; B measures the round trip, sends
SYNC and waits half of it; A dials as soon as SYNC arrives. Both dial from their listen ports, so
their SYNs cross in the NATs' mappings: a TCP simultaneous open. B acts as the client of the
upgrade (Noise initiator), A as the server; old go-libp2p (v0.32) swaps these roles, so the last
attempt swaps them too. On success the Host prefers the direct connection and B closes the
relayed one after a grace period; on failure the relayed connection simply stays.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from ...errors import RemoteProtocolError, VolunteerError, describe
from ..connection import Connection, Direction, Path
from ..events import PeerConnected, PeerIdentified
from ..multiaddr import Multiaddr
from ..pb import dcutr_pb2
from ..streams import BufferedStream, close_quietly
from ..varint import encode_uvarint
from .observed import ObservedAddrs

log = logging.getLogger(__name__)

DCUTR = "/libp2p/dcutr"
MAX_MESSAGE = 4096
MAX_ATTEMPTS = 3
MAX_PUNCH_ADDRS = 4  # sockets opened per attempt, at most
MAX_CONCURRENT_PUNCHES = 8
DIAL_TIMEOUT = 5.0  # longer than one SYN retransmission (1 s), for the SYN the NAT dropped first
STREAM_TIMEOUT = 15.0
RELAY_GRACE = 2.0
OBSERVATION_WAIT = 2.0  # seconds the relayed connection lives on after the direct one is up
HolePunch = dcutr_pb2.HolePunch


def encode(kind: int, addrs: list[Multiaddr] = ()) -> bytes:
    message = HolePunch(type=kind, ObsAddrs=[a.to_bytes() for a in addrs])
    body = message.SerializeToString()
    return encode_uvarint(len(body)) + body


async def read(stream: BufferedStream, expected: int) -> list[Multiaddr]:
    body = await stream.receive_length_prefixed(MAX_MESSAGE, "dcutr message")
    message = HolePunch()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf DecodeError
        raise RemoteProtocolError(f"malformed dcutr message: {exc}") from None
    if message.type != expected:
        raise RemoteProtocolError(f"expected dcutr {HolePunch.Type.Name(expected)}, got type {message.type}")
    return punchable(message.ObsAddrs)


def punchable(raw_addrs) -> list[Multiaddr]:
    """Addresses we can hole punch: direct TCP ones, at most MAX_PUNCH_ADDRS."""
    addrs = []
    for raw in raw_addrs[: 4 * MAX_PUNCH_ADDRS]:
        try:
            addr = Multiaddr.from_bytes(raw).without_peer_id()
        except VolunteerError:
            continue
        names = addr.protocols()
        if len(names) == 2 and names[0] in ("ip4", "ip6") and names[1] == "tcp" and addr not in addrs:
            addrs.append(addr)
    return addrs[:MAX_PUNCH_ADDRS]


def attempt_roles(attempt: int, max_attempts: int = MAX_ATTEMPTS) -> tuple[Direction, Direction]:
    """(initiator B's role, responder A's role) for an attempt (1-based): spec roles, swapped on the last."""
    if attempt == max_attempts and max_attempts > 1:
        return Direction.INBOUND, Direction.OUTBOUND
    return Direction.OUTBOUND, Direction.INBOUND


@dataclass
class PunchOutcome:
    """What happened to one hole punch (shown by the dashboard and the benchmark)."""

    peer: str
    success: bool = False
    attempts: int = 0
    rtt: float | None = None  # relayed round trip, measured by CONNECT
    seconds: float = 0.0  # from the relayed connection to the direct one
    error: str = ""
    roles_swapped: bool = False

    @property
    def rtts(self) -> float | None:
        return self.seconds / self.rtt if self.rtt else None


@dataclass
class HolePuncher:
    """Runs DCUtR on a Host: initiates on inbound relayed connections, answers on the others."""

    host: object
    observed: ObservedAddrs = field(default_factory=ObservedAddrs)
    max_attempts: int = MAX_ATTEMPTS
    outcomes: list[PunchOutcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._slots = trio.Semaphore(MAX_CONCURRENT_PUNCHES)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        events = self.host.events.subscribe()
        self.host.set_handler(DCUTR, self.handle)
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for event in events:
                if isinstance(event, PeerIdentified) and event.info is not None and event.info.observed_addr is not None:
                    conn = event.connection
                    self.observed.record(event.peer, conn.remote_addr, conn.local_addr, event.info.observed_addr, trio.current_time())
                elif isinstance(event, PeerConnected):
                    conn = event.connection
                    if conn.path is Path.RELAYED and conn.direction is Direction.INBOUND:
                        nursery.start_soon(self.initiate, conn)

    def our_addrs(self) -> list[Multiaddr]:
        """What we tell the other side to dial: observed external addresses of our listen port."""
        now = trio.current_time()
        ports = [int(a.value_for("tcp")) for a in self.host.listen_addrs if a.value_for("tcp")]
        addrs: list[Multiaddr] = []
        for port in ports or [None]:
            addrs += [a for a in self.observed.candidates(now, port) if a not in addrs]
        return addrs[:MAX_PUNCH_ADDRS]

    async def initiate(self, relayed: Connection) -> PunchOutcome:
        """We are B: the relayed connection came to us. Try to punch a direct one."""
        peer = relayed.remote_peer
        outcome = PunchOutcome(str(peer))
        started = trio.current_time()
        async with self._slots:
            # Let identify run first: its observed addresses are what we send.
            await trio.sleep(0)
            try:
                with trio.fail_after(STREAM_TIMEOUT * self.max_attempts):
                    stream = BufferedStream(await relayed.new_stream([DCUTR]))
                    try:
                        await self._await_observed_addrs()
                        for attempt in range(1, self.max_attempts + 1):
                            outcome.attempts = attempt
                            sent = trio.current_time()
                            await stream.send_all(encode(HolePunch.CONNECT, self.our_addrs()))
                            remote_addrs = await read(stream, HolePunch.CONNECT)
                            outcome.rtt = rtt = trio.current_time() - sent
                            our_role, _ = attempt_roles(attempt, self.max_attempts)
                            outcome.roles_swapped = our_role is Direction.INBOUND
                            with self._expecting(peer, remote_addrs, our_role):
                                await stream.send_all(encode(HolePunch.SYNC))
                                if not remote_addrs:
                                    outcome.error = "the peer sent no addresses to punch"
                                    continue
                                await trio.sleep(rtt / 2)
                                direct = await self._punch(peer, remote_addrs, our_role)
                            if direct is not None:
                                outcome.success = True
                                break
                    finally:
                        await close_quietly(stream)
            except (VolunteerError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                outcome.error = describe(exc)
        outcome.seconds = trio.current_time() - started
        self.outcomes.append(outcome)
        del self.outcomes[:-100]
        log.info("hole punch with %s: %s after %d attempt(s)", peer.short(), "direct" if outcome.success else f"stays relayed ({outcome.error})", outcome.attempts)
        if outcome.success:
            await trio.sleep(RELAY_GRACE)
            await relayed.aclose()
        return outcome

    async def handle(self, stream) -> None:
        """We are A: the peer we reached through a relay asks to punch."""
        buffered = BufferedStream(stream)
        peer = stream.remote_peer
        await self._await_observed_addrs()
        for attempt in range(1, self.max_attempts + 1):
            _, our_role = attempt_roles(attempt, self.max_attempts)
            try:
                with trio.fail_after(STREAM_TIMEOUT):
                    remote_addrs = await read(buffered, HolePunch.CONNECT)
                    with self._expecting(peer, remote_addrs, our_role):
                        await buffered.send_all(encode(HolePunch.CONNECT, self.our_addrs()))
                        await read(buffered, HolePunch.SYNC)
                        punched = remote_addrs and await self._punch(peer, remote_addrs, our_role) is not None
            except (RemoteProtocolError, trio.TooSlowError):
                return  # B closed the stream (done, or gave up) or broke the protocol
            if punched:
                return

    async def _await_observed_addrs(self) -> None:
        """Identify with the relay may still be in flight: give our observed address a moment."""
        with trio.move_on_after(OBSERVATION_WAIT):
            while not self.our_addrs():
                await trio.sleep(0.05)

    @contextmanager
    def _expecting(self, peer, addrs: list[Multiaddr], role: Direction):
        """While we punch as the upgrade's client, the peer's SYN may reach our listener before
        ours leaves: tell the Host such a connection is this punch, so we keep the client role."""
        registered = [addr for addr in addrs if role is Direction.OUTBOUND and addr not in self.host.expected_punches]
        for addr in registered:
            self.host.expected_punches[addr] = peer
        try:
            yield
        finally:
            for addr in registered:
                self.host.expected_punches.pop(addr, None)

    async def _punch(self, peer, addrs: list[Multiaddr], role: Direction) -> Connection | None:
        """Dial every address at once from our listen port; the first to upgrade wins."""
        winner: list[Connection] = []
        with trio.move_on_after(DIAL_TIMEOUT + self.host.config.handshake_timeout):
            async with trio.open_nursery() as nursery:
                async def dial(addr: Multiaddr) -> None:
                    try:
                        # From our listen port only: any other port has no NAT mapping to punch.
                        conn = await self.host.dial_addr(addr, peer, role=role, path=Path.HOLE_PUNCHED, reuse_port_only=True)
                    except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                        log.debug("punch to %s failed: %s", addr, describe(exc))
                        return
                    winner.append(conn)
                    nursery.cancel_scope.cancel()

                async def watch() -> None:
                    # The peer's SYN may reach our listener first: that connection counts too.
                    while True:
                        conn = self.host.connection_to(peer)
                        if _is_direct(conn):
                            winner.append(conn)
                            nursery.cancel_scope.cancel()
                        await trio.sleep(0.01)

                for addr in addrs:
                    nursery.start_soon(dial, addr)
                nursery.start_soon(watch)
        return winner[0] if winner else None


def _is_direct(conn: Connection | None) -> bool:
    return conn is not None and conn.path is not Path.RELAYED
