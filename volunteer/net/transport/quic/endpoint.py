"""One UDP socket that listens, dials and punches, demultiplexing QUIC connections by connection ID.

go-libp2p's ``quicreuse`` shape: the socket bound to our QUIC listen port also carries every
connection we dial and every hole-punch packet we send, so a NAT maps one external port for all
of them and the address peers observe is the one we advertise. The reader drains every datagram
waiting on the socket, hands each to its connection (``demux.route``), and only then lets the
touched connections answer, so one burst costs one round of ACKs. New connections are admitted
by ``demux.Admission``; everything else that arrives is dropped and counted by reason.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable

from typing import TYPE_CHECKING

import trio

from ....errors import HandshakeError, VolunteerError, describe
from ... import limits
from .demux import Admission, route
from .settings import QuicLimits

if TYPE_CHECKING:
    from aioquic.quic.configuration import QuicConfiguration

    from .engine import Engine
    from .session import QuicSession

Address = tuple  # a socket address: (host, port) or (host, port, flowinfo, scope_id)

log = logging.getLogger(__name__)

MAX_BATCH = 256  # datagrams drained from the socket before the touched connections answer
SOCKET_BUFFER = 4 * 1024 * 1024

SessionHandler = Callable[["QuicSession"], Awaitable[None]]
# A pending-handshake slot shared with the Host's other transports (the resource manager's, per
# source address): a function that releases it, or None when refused.
SharedSlot = Callable[[Address], "Callable[[], None] | None"]
ConfigFactory = Callable[[bool], "QuicConfiguration"]  # is_client -> a fresh configuration


# Linux's IP_RECVERR / IPV6_RECVERR (not in Python's socket module): ICMP errors (port, host or
# network unreachable) for an unconnected UDP socket are queued with the address they concern,
# instead of being dropped; MSG_ERRQUEUE reads them.
RECVERR: dict[int, tuple[int, int]] = {socket.AF_INET: (socket.IPPROTO_IP, 11), socket.AF_INET6: (socket.IPPROTO_IPV6, 25)}
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
# sendto errors that mean this destination cannot be reached from this socket at all (no route,
# another family, a source it cannot use): a dial's handshake ends at once, as TCP's connect does
UNREACHABLE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT,
                         errno.EINVAL, errno.EACCES, errno.EPERM, errno.ECONNREFUSED})
MAX_ERRQUEUE = 64  # queued ICMP errors read per wake-up


def _enable_recverr(sock: socket.socket, family: int) -> bool:
    if not sys.platform.startswith("linux") or family not in RECVERR:
        return False
    level, option = RECVERR[family]
    try:
        sock.setsockopt(level, option, 1)
    except OSError:
        return False
    return True


def open_udp_socket(host: str, port: int, family: int) -> socket.socket:
    """A non-blocking UDP socket bound to (host, port), with large kernel buffers (bursts of
    datagrams between two reads are the normal case at speed), and ICMP errors reported (Linux)."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _enable_recverr(sock, family)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError:
                pass  # the kernel caps it (net.core.rmem_max): the default still works, only slower
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _abort(session: "QuicSession", reason: BaseException) -> None:
    session.abort(reason)
    await trio.lowlevel.checkpoint()


def _nothing() -> None:
    """The release of a slot nobody shares."""


class UdpEndpoint:
    """A UDP socket and the QUIC connections on it (see the module docstring).

    ``accept`` (set while we listen) receives each inbound connection once its handshake is done
    and runs it until it ends. ``closes_when_idle``: a throw-away socket of one dial, closed with
    its last connection.
    """

    def __init__(
        self,
        sock: socket.socket,
        make_config: ConfigFactory,
        *,
        quic_limits: QuicLimits,
        handshake_timeout: float = limits.HANDSHAKE_TIMEOUT,
        admission: Admission | None = None,
        closes_when_idle: bool = False,
        shared_slot: SharedSlot | None = None,
    ) -> None:
        self.sock = sock
        self.local: Address = sock.getsockname()
        self.family = sock.family
        self._make_config = make_config
        self.quic_limits = quic_limits
        self.handshake_timeout = handshake_timeout
        self.admission = admission or Admission()
        self.closes_when_idle = closes_when_idle
        self._shared_slot = shared_slot
        self.accept: SessionHandler | None = None
        self._routes: dict[bytes, "QuicSession"] = {}
        self.sessions: set["QuicSession"] = set()
        self._nursery: trio.Nursery | None = None
        self.send_dropped = 0
        self.datagrams_received = 0
        self.unreachable = 0  # dials ended early by a send error or an ICMP error
        self._fail_fast: set["QuicSession"] = set()  # our dials that an ICMP error may end
        self._logged_at: dict[str, float] = {}

    @property
    def port(self) -> int:
        return int(self.local[1])

    # --- lifetime ---------------------------------------------------------------------------
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read datagrams and run the connections' tasks until cancelled or closed."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._read_loop()
        finally:
            self._nursery = None
            for session in list(self.sessions):
                session.abort(VolunteerError("the UDP endpoint closed"))
            self.sock.close()

    def close(self) -> None:
        """Stop reading and end every connection on this socket."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _spawn(self, async_fn, *args) -> None:
        if self._nursery is None:
            raise trio.ClosedResourceError("the UDP endpoint is closed")
        self._nursery.start_soon(async_fn, *args)

    # --- datagrams ---------------------------------------------------------------------------
    def send(self, data: bytes, addr: Address) -> None:
        """Send one datagram now; a full socket buffer drops it (QUIC retransmits what matters).

        A destination this socket cannot reach (no route, another family: ``UNREACHABLE``) ends
        the handshakes of our dials to it at once, as TCP's connect fails at once; an error the
        kernel kept from an earlier ICMP message is that message's (``_read_errors``)."""
        try:
            self.sock.sendto(data, addr)
        except BlockingIOError:
            self.send_dropped += 1
        except OSError as exc:  # an established connection's timers decide; a dial ends now
            self._note("send_error", f"UDP send to {addr[0]}:{addr[1]} failed: {exc}")
            if self._read_errors() == 0 and exc.errno in UNREACHABLE:
                self._unreachable(addr, f"no way to {addr[0]}:{addr[1]}: {exc.strerror or exc}", icmp=False)

    def _read_errors(self) -> int:
        """Read the ICMP errors the kernel queued (IP_RECVERR), ending our dials to each
        address they name; how many were read."""
        count = 0
        for _ in range(MAX_ERRQUEUE):
            try:
                _, ancillary, _, addr = self.sock.recvmsg(64, 512, MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break  # no error queue here (not Linux), or the socket closed
            count += 1
            code = next((int.from_bytes(data[:4], sys.byteorder) for _, _, data in ancillary if len(data) >= 4), 0)
            if addr:
                reason = os.strerror(code) if code else "an ICMP error"
                self._unreachable(addr, f"{addr[0]}:{addr[1]} answered: {reason}", icmp=True)
        return count

    def _unreachable(self, addr: Address, reason: str, *, icmp: bool) -> None:
        # Ends (soon, not inside this send: aborting sends a CONNECTION_CLOSE) the handshakes
        # of our dials to ``addr``. An ICMP error ends only ordinary dials: a hole punch's first
        # packets meet the peer's NAT before its own packets opened it, and some routers answer
        # those with "port unreachable".
        for session in list(self.sessions):
            if session.handshake_done.is_set() or session.closed.is_set() or session.remote[:2] != addr[:2]:
                continue
            if icmp and session not in self._fail_fast:
                continue
            self._fail_fast.discard(session)
            self.unreachable += 1
            failure = HandshakeError(f"QUIC dial failed: {reason}")
            if self._nursery is not None:
                self._nursery.start_soon(_abort, session, failure)

    async def _read_loop(self) -> None:
        sock = self.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            touched: set["QuicSession"] = set()
            read = 0
            for _ in range(MAX_BATCH):
                try:
                    data, addr = sock.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    # an ICMP error (port unreachable...): its details wait in the error queue
                    self._note("receive_error", f"UDP receive failed: {exc}")
                    self._read_errors()
                    continue
                read += 1
                self.datagrams_received += 1
                session = self._dispatch(data, addr, now)
                if session is not None:
                    touched.add(session)
            if not read:
                # woken with nothing to read: an ICMP error waits in the error queue (its pending
                # error may have gone to a send), and would wake us again and again until read
                self._read_errors()
            for session in touched:
                if not session.closed.is_set():
                    session.flush(now)

    def _dispatch(self, data: bytes, addr: Address, now: float) -> "QuicSession | None":
        found = route(data, limits.QUIC_CONNECTION_ID_LENGTH)
        if found is None:
            self.admission.drop("not_quic")  # hole-punch packets and garbage
            return None
        session = self._routes.get(found.destination_cid)
        if session is not None:
            session.datagram_received(data, addr, now)
            return session
        if not found.opens_connection:
            self.admission.drop("unknown_connection")
            return None
        if self.accept is None:
            self.admission.drop("not_listening")
            return None
        source = str(addr[0])
        if not self.admission.admit(source):
            self._note("handshake_refused", f"QUIC handshake from {source} refused: too many pending handshakes")
            return None
        release = self._shared_slot(addr) if self._shared_slot is not None else _nothing
        if release is None:  # the address's share of the Host's handshakes (TCP ones too) is taken
            self.admission.handshake_over(source)
            self.admission.connection_over()
            self.admission.drop("shared_pending_handshakes")
            return None
        from .engine import Engine  # aioquic loads with the first connection, not with the socket

        engine = Engine(
            configuration=self._make_config(False),
            quic_limits=self.quic_limits,
            original_destination_connection_id=found.destination_cid,
        )
        session = self._adopt(engine, addr)
        self._routes[found.destination_cid] = session
        session.datagram_received(data, addr, now)
        self._spawn(self._serve_inbound, session, source, release)
        return session

    def _adopt(self, engine: "Engine", remote: Address) -> "QuicSession":
        from .session import QuicSession

        session = QuicSession(engine, remote, self.send, quic_limits=self.quic_limits)
        session.on_route(self._route_changed)
        session.on_closed(self._forget)
        for cid in engine.host_connection_ids():
            self._routes[cid] = session
        self.sessions.add(session)
        self._spawn(session.run_timers)
        return session

    def _route_changed(self, session: "QuicSession", cid: bytes, issued: bool) -> None:
        if issued:
            self._routes[cid] = session
        elif self._routes.get(cid) is session:
            del self._routes[cid]

    def _forget(self, session: "QuicSession") -> None:
        self._fail_fast.discard(session)
        for cid in [cid for cid, owner in self._routes.items() if owner is session]:
            del self._routes[cid]
        self.sessions.discard(session)
        if self.closes_when_idle and not self.sessions:
            self.close()

    # --- connections -------------------------------------------------------------------------
    async def _serve_inbound(self, session: "QuicSession", source: str, release: Callable[[], None]) -> None:
        try:
            try:
                with trio.fail_after(self.handshake_timeout):
                    await session.wait_handshake()
            except (trio.TooSlowError, HandshakeError) as exc:
                reason = "timed out" if isinstance(exc, trio.TooSlowError) else describe(exc)
                session.abort(HandshakeError(f"inbound QUIC handshake from {source}: {reason}"))
                log.info("inbound QUIC handshake from %s failed: %s", source, reason)
                return
            finally:
                self.admission.handshake_over(source)
                release()
            accept = self.accept
            if accept is None:
                await session.aclose()
                return
            await accept(session)
        finally:
            self.admission.connection_over()
            if not session.closed.is_set():
                await session.aclose()

    async def connect(self, remote: Address, *, fail_fast: bool = True) -> "QuicSession":
        """Dial ``remote`` from this socket; returns once the handshake and the certificate check
        are done (the caller bounds the time; a cancelled dial aborts the connection).
        ``fail_fast``: an ICMP error from ``remote`` (port or host unreachable) ends the dial at
        once, as it does TCP's; off for hole punches (see ``_unreachable``)."""
        from .engine import Engine

        engine = Engine(configuration=self._make_config(True), quic_limits=self.quic_limits)
        session = self._adopt(engine, remote)
        if fail_fast:
            self._fail_fast.add(session)
        engine.connect(remote, now=trio.current_time())
        session.flush()
        try:
            await session.wait_handshake()
        except BaseException as exc:
            session.abort(exc if isinstance(exc, VolunteerError) else HandshakeError(f"QUIC dial to {remote[0]}:{remote[1]} abandoned"))
            raise
        return session

    def answering(self, host: str) -> bool:
        """Whether a dial of ours to ``host`` is still in its handshake and has heard from it:
        the peer is answering, however slowly (a UDP-dropping firewall lets nothing back)."""
        return any(s.is_client and s.bytes_received and not s.handshake_done.is_set() and str(s.remote[0]) == host
                   for s in self.sessions)

    # --- hole punching ------------------------------------------------------------------------
    def punch(self, remote: Address, size: int = limits.QUIC_HOLE_PUNCH_PACKET) -> None:
        """One datagram of random bytes to ``remote`` from this socket: it opens our NAT's mapping
        toward the peer, whose QUIC dial can then come in (the peer's endpoint drops it as not QUIC:
        a random first byte with the long-header bit clear is a short header of no known connection)."""
        payload = bytearray(os.urandom(size))
        payload[0] &= 0x3F  # short header, fixed bit clear: never mistaken for a packet that opens a connection
        self.send(bytes(payload), remote)

    def _note(self, reason: str, message: str) -> None:
        """Log at most one line per reason every QUIC_UNKNOWN_DATAGRAM_LOG_INTERVAL seconds."""
        now = trio.current_time()
        if now - self._logged_at.get(reason, -1e9) >= limits.QUIC_UNKNOWN_DATAGRAM_LOG_INTERVAL:
            self._logged_at[reason] = now
            log.info("%s", message)

    def stats(self) -> dict:
        """Connections, datagrams and the reasons datagrams were dropped (for status views)."""
        return {
            "port": self.port,
            "connections": len(self.sessions),
            "datagrams_received": self.datagrams_received,
            "send_dropped": self.send_dropped,
            "unreachable": self.unreachable,
            "dropped": dict(self.admission.dropped),
        }


__all__ = ["UdpEndpoint", "open_udp_socket"]
