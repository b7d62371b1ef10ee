"""The trio driver of one QUIC connection: aioquic's ``Engine`` plus streams, timers and the
libp2p TLS check, shaped like the secure channel and the muxer the Host expects of a connection.

Every call into the engine is synchronous and followed by ``flush``: its events are handled
(stream data, resets, the handshake, the end) and its datagrams leave through the endpoint's
socket at once. The endpoint's reader feeds datagrams in; one timer task per connection (run in
the endpoint's nursery) handles the engine's timers (loss detection, idle timeout, ACK delay).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio
from aioquic.quic import events

from ... import limits
from ....errors import ConnectionClosed, ConnectionLost, HandshakeError, PeerIDMismatch, StreamReset, VolunteerError
from ...identity import PeerID, PublicKey
from ..pathloss import PathLoss
from ...tls import ALPN, verify_certificate
from . import repair
from .engine import Engine, QuicLimits
from .repair import RepairDecoder, RepairEncoder
from .stream import QuicStream

if TYPE_CHECKING:
    from .budget import ConnectionBudget

log = logging.getLogger(__name__)

# Application error code of a CONNECTION_CLOSE when the libp2p certificate check fails.
CERTIFICATE_REFUSED = 0x1
PING_TIMEOUT_CODE = 0x2

Address = tuple  # a socket address: (host, port) or (host, port, flowinfo, scope_id)
SendDatagram = Callable[[bytes, Address], None]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class QuicSession:
    """One QUIC connection to one peer (see the module docstring). ``remote_peer`` is known once
    ``handshake_done`` is set; ``closed`` is set when the connection is over, either way."""

    def __init__(
        self,
        engine: Engine,
        remote: Address,
        send_datagram: SendDatagram,
        *,
        quic_limits: QuicLimits,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.remote = remote
        self._send_datagram = send_datagram
        self.quic_limits = quic_limits
        self._wall_clock = wall_clock  # certificates carry calendar dates; protocol timers use trio's clock
        self.is_client = engine.configuration.is_client
        self._remote_peer: PeerID | None = None
        self._remote_public_key: PublicKey | None = None
        self.handshake_done = trio.Event()
        self.closed = trio.Event()
        self.close_reason: BaseException | None = None
        self.streams: dict[int, QuicStream] = {}
        # The highest stream id the peer opened, and the lower ones its opening implied (RFC 9000
        # section 3.2) whose first bytes have not come yet: any other id at or below it is a
        # stream we already forgot. At most max_streams of them: the peer's own limit.
        self._peer_stream_high = -1
        self._peer_streams_implied: set[int] = set()
        self._scope: "ConnectionBudget | None" = None
        self._accept_send, self._accept_receive = trio.open_memory_channel[QuicStream](quic_limits.accept_backlog)
        self._timer_changed = trio.Event()
        self._timer_at: float | None = None
        self._progress = trio.lowlevel.ParkingLot()  # writers waiting for acknowledgements
        self._pings: dict[int, tuple[float, trio.Event]] = {}
        self._next_ping = 1
        self.rtt: float | None = None
        self._on_closed: list[Callable[["QuicSession"], None]] = []
        self._on_route: list[Callable[["QuicSession", bytes, bool], None]] = []
        self.bytes_received = 0
        # repairs (repair.py): both set once the peer said it understands them
        self._encoder: RepairEncoder | None = None
        self._decoder: RepairDecoder | None = None
        self._peer_rebuilt = 0  # how many of our datagrams the peer says it rebuilt

    # --- wiring ---------------------------------------------------------------------------
    def on_closed(self, callback: Callable[["QuicSession"], None]) -> None:
        """Call ``callback(self)`` once when the connection ends (the endpoint drops its routes)."""
        self._on_closed.append(callback)

    def on_route(self, callback: Callable[["QuicSession", bytes, bool], None]) -> None:
        """Call ``callback(self, cid, issued)`` when we issue or retire one of our connection IDs."""
        self._on_route.append(callback)

    def attach_scope(self, scope: "ConnectionBudget") -> None:
        """This connection's budget (the Host hands in the resource manager's scope): streams and
        buffered bytes count there from now on; it is closed when the connection ends."""
        self._scope = scope
        if self.closed.is_set():
            scope.close()

    # --- the engine's clock and I/O ---------------------------------------------------------
    def datagram_received(self, data: bytes, addr: Address, now: float) -> None:
        """A datagram for this connection arrived (the endpoint calls ``flush`` after a batch)."""
        self.bytes_received += len(data)
        if repair.is_repair_datagram(data):
            self._on_repair_datagram(data, addr, now)
            return
        if self._decoder is not None:
            self._decoder.received(data)
        self.engine.receive_datagram(data, addr, now)

    def _on_repair_datagram(self, data: bytes, addr: Address, now: float) -> None:
        if self.closed.is_set() or addr[:2] != self.remote[:2]:
            return  # from elsewhere than the peer's path: someone who learned the connection ID
        # a hello may come before our handshake is done (in the batch of the peer's Finished);
        # what it turns on costs bytes at most: rebuilt datagrams pass QUIC's authentication
        self._repairs_heard()
        reported = repair.parse_rebuilt(data)
        if reported is not None:
            if reported > self._peer_rebuilt:
                self.engine.congestion.note_repaired(reported - self._peer_rebuilt)
                self._peer_rebuilt = reported
            return
        assert self._decoder is not None
        rebuilt = self._decoder.repair(data)
        for datagram in rebuilt:
            self.engine.receive_datagram(datagram, addr, now)
        if rebuilt:
            self._send_datagram(repair.rebuilt_report(self.engine.peer_connection_id(), self._decoder.rebuilt), addr)

    def _repairs_heard(self) -> None:
        """The peer understands repairs: rebuild what it protects, protect what we send when the
        path loses packets (datagrams shrink by what a repair adds, so repairs fit the path too)."""
        if self._decoder is not None:
            return
        self._decoder = RepairDecoder()
        self._encoder = RepairEncoder()
        self.engine.lower_datagram_size(self.engine.datagram_size - repair.OVERHEAD)

    def _repairing(self) -> bool:
        """Whether what we send now gets repairs: the peer understands them and the path lost
        some of our recent packets (a clean path pays nothing)."""
        congestion = self.engine.congestion
        congestion.tolerate(self._encoder is not None and congestion.losing)
        return congestion.tolerant

    def _send(self, data: bytes, addr: Address, now: float, repairing: bool) -> None:
        self._send_datagram(data, addr)
        if repairing and self._encoder is not None and repair.protectable(data, self.engine.datagram_size):
            for extra in self._encoder.add(data, self.engine.peer_connection_id(), now):
                self._send_datagram(extra, addr)

    def flush(self, now: float | None = None) -> None:
        """Handle the engine's events, send its datagrams, and re-arm the timer."""
        now = trio.current_time() if now is None else now
        engine = self.engine
        while (event := engine.next_event()) is not None:
            self._on_event(event, now)
        repairing = self._repairing()
        for data, addr in engine.datagrams_to_send(now):
            self._send(data, addr, now, repairing)
        timer = engine.get_timer()
        if self._encoder is not None:
            self._encoder.wait_for(engine.smoothed_rtt())
            # only with a block open is the streams' backlog worth a look (every flush passes here)
            burst_over = self._encoder.deadline is not None and not engine.has_unsent_data()
            for extra in self._encoder.due(engine.peer_connection_id(), now, burst_over=burst_over):
                self._send_datagram(extra, self.remote)
            deadline = self._encoder.deadline
            if deadline is not None and (timer is None or deadline < timer):
                timer = deadline
        if timer != self._timer_at:
            self._timer_at = timer
            self._timer_changed.set()
        self._progress.unpark_all()

    async def run_timers(self) -> None:
        """Fire the engine's timers until the connection is over (run in the endpoint's nursery)."""
        while not self.closed.is_set():
            changed = self._timer_changed
            deadline = self._timer_at if self._timer_at is not None else float("inf")
            with trio.move_on_at(deadline):
                await changed.wait()
            if changed.is_set():
                self._timer_changed = trio.Event()
                continue
            now = trio.current_time()
            self._timer_at = None
            engine_timer = self.engine.get_timer()
            if engine_timer is not None and engine_timer <= now:
                self.engine.handle_timer(now)
            self.flush(now)  # also sends the repairs of a block that waited long enough

    # --- events ---------------------------------------------------------------------------
    def _on_event(self, event: events.QuicEvent, now: float) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._on_stream_data(event, now)
        elif isinstance(event, events.StreamReset):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._on_reset(StreamReset(f"stream {event.stream_id} was reset by the peer (code {event.error_code})"))
                self.maybe_forget(stream)
        elif isinstance(event, events.StopSendingReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._on_stop_sending()
                self.maybe_forget(stream)
        elif isinstance(event, events.HandshakeCompleted):
            self._on_handshake(event)
        elif isinstance(event, events.PingAcknowledged):
            sent = self._pings.pop(event.uid, None)
            if sent is not None:
                self.rtt = now - sent[0]
                sent[1].set()
        elif isinstance(event, (events.ConnectionIdIssued, events.ConnectionIdRetired)):
            issued = isinstance(event, events.ConnectionIdIssued)
            for callback in self._on_route:
                callback(self, bytes(event.connection_id), issued)
        elif isinstance(event, events.ConnectionTerminated):
            reason = event.reason_phrase or f"error code {event.error_code:#x}"
            self._terminate(ConnectionLost(f"QUIC connection to {self.remote[0]}:{self.remote[1]} ended: {reason}"))

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        try:
            if event.alpn_protocol != ALPN:
                raise HandshakeError(f"the peer negotiated ALPN {event.alpn_protocol!r}, not {ALPN!r}")
            certificate = self.engine.peer_certificate()
            if certificate is None:
                raise HandshakeError("the peer presented no certificate")
            if self.engine.peer_certificate_chain_length():
                raise HandshakeError("the peer sent a certificate chain; libp2p allows one certificate")
            key = verify_certificate(certificate, now=self._wall_clock())
        except HandshakeError as exc:
            self.engine.close(error_code=CERTIFICATE_REFUSED, reason_phrase="libp2p certificate refused")
            self._terminate(exc)
            return
        self._remote_public_key = key
        self._remote_peer = PeerID.from_public_key(key)
        if _is_loopback(self.remote[0]):
            # loopback's MTU is 64 KiB: fewer, bigger datagrams (as far as the peer accepts them)
            self.engine.raise_datagram_size(self.quic_limits.loopback_datagram)
        if self.quic_limits.repairs:
            # a few, in case one is lost; a peer that is not us drops them as not QUIC
            for _ in range(limits.QUIC_REPAIR_HELLOS):
                self._send_datagram(repair.hello(self.engine.peer_connection_id()), self.remote)
        self.handshake_done.set()

    def _on_stream_data(self, event: events.StreamDataReceived, now: float) -> None:
        stream_id = event.stream_id
        stream = self.streams.get(stream_id)
        if stream is None:
            forgotten = stream_id <= self._peer_stream_high and stream_id not in self._peer_streams_implied
            if stream_id % 4 != (1 if self.is_client else 0) or forgotten:
                # one of ours or a unidirectional one (libp2p has none), or one we already forgot:
                # late bytes nobody will read
                self._refuse(stream_id, event, reset=stream_id % 4 < 2)
                return
            stream = self._accept(stream_id, now)
            if stream is None:
                self._refuse(stream_id, event, reset=True)
                return
        if not stream._on_data(event.data, event.end_stream, now):
            log.info("QUIC stream %d from %s: buffered bytes refused by the resource manager; reset", stream_id, self.remote[0])
            self.reset_stream(stream_id, 0, reading=True)
            stream._on_reset(StreamReset(f"stream {stream_id}: the resource manager refused its buffered bytes"))
            self.maybe_forget(stream)
            return
        self.maybe_forget(stream)

    def _accept(self, stream_id: int, now: float) -> QuicStream | None:
        scope = None
        if self._scope is not None:
            scope = self._scope.open_stream(True, now=now)
            if scope is None:
                return None
        if stream_id > self._peer_stream_high:
            first = self._peer_stream_high + 4 if self._peer_stream_high >= 0 else stream_id % 4
            self._peer_streams_implied.update(range(first, stream_id, 4))
            self._peer_stream_high = stream_id
        self._peer_streams_implied.discard(stream_id)
        stream = QuicStream(self, stream_id, scope)
        try:
            self._accept_send.send_nowait(stream)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            stream._release_scope()
            return None
        self.streams[stream_id] = stream
        self.engine.read_offsets.setdefault(stream_id, 0)
        return stream

    def _refuse(self, stream_id: int, event: events.StreamDataReceived, *, reset: bool) -> None:
        """Drop a stream we will not serve: its bytes count as read (the credit stays right)."""
        self.engine.discarded(len(event.data))
        if reset and not event.end_stream:
            self.reset_stream(stream_id, 0, reading=True)

    # --- what streams ask of the connection -------------------------------------------------
    def consumed(self, stream_id: int, count: int) -> None:
        """The application read ``count`` bytes: grant credit (and send it) when enough is due."""
        if stream_id in self.streams:
            self.engine.consumed(stream_id, count)
        else:
            self.engine.discarded(count)
        if self.engine.credit_due(stream_id) and not self.closed.is_set():
            self.flush()

    def write(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        """Queue ``data`` on ``stream_id`` and send what the congestion window allows."""
        self._check_open()
        try:
            self.engine.send_stream_data(stream_id, data, end_stream=end_stream)
        except ValueError as exc:  # the stream was reset or finished under us
            raise StreamReset(f"stream {stream_id}: {exc}") from None
        self.flush()

    async def wait_send_room(self, stream: QuicStream) -> None:
        """Wait until ``stream`` has fewer than ``send_buffer`` unacknowledged bytes."""
        limit = self.quic_limits.send_buffer
        while self.engine.unacknowledged(stream.stream_id) >= limit:
            self._check_open()
            stream._check_writable()
            await self._progress.park()
        self._check_open()
        await trio.lowlevel.checkpoint()

    def stop_reading(self, stream_id: int, code: int) -> None:
        """STOP_SENDING: we will not read the rest of ``stream_id``."""
        if self.closed.is_set():
            return
        try:
            self.engine.stop_stream(stream_id, code)
        except ValueError:
            return  # unknown or already finished: nothing to stop
        self.flush()

    def reset_stream(self, stream_id: int, code: int, *, reading: bool) -> None:
        """RESET_STREAM (and STOP_SENDING when ``reading``) on ``stream_id``."""
        if self.closed.is_set():
            return
        try:
            self.engine.reset_stream(stream_id, code)
            if reading:
                self.engine.stop_stream(stream_id, code)
        except ValueError:
            pass  # the stream is already finished in that direction
        self.flush()

    def maybe_forget(self, stream: QuicStream) -> None:
        """Drop a stream that is over in both directions (its resource scope is released)."""
        if stream.finished and self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
            self.engine.forget(stream.stream_id)
            stream._release_scope()

    # --- the muxer the Host drives ----------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep the connection alive (a PING every keepalive interval, which also measures the RTT)
        until it ends."""
        task_status.started()
        while not self.closed.is_set():
            with trio.move_on_after(self.quic_limits.keepalive_interval):
                await self.closed.wait()
            if not self.closed.is_set():
                self._send_ping()

    def _send_ping(self) -> trio.Event:
        uid = self._next_ping
        self._next_ping += 1
        answered = trio.Event()
        self._pings[uid] = (trio.current_time(), answered)
        while len(self._pings) > 8:  # unanswered pings of a silent peer: the idle timeout ends it
            self._pings.pop(next(iter(self._pings)))
        self.engine.send_ping(uid)
        self.flush()
        return answered

    async def ping(self) -> float:
        """One round trip, in seconds (a QUIC PING and its ACK)."""
        self._check_open()
        answered = self._send_ping()
        await answered.wait()
        assert self.rtt is not None
        return self.rtt

    async def open_stream(self, *, announce: bool = True) -> QuicStream:
        """A new outbound stream (QUIC announces it with its first bytes, so ``announce`` is moot)."""
        self._check_open()
        scope = None
        if self._scope is not None:
            scope = self._scope.open_stream(False, now=trio.current_time())
            if scope is None:
                raise VolunteerError("outbound stream refused by the resource manager")
        stream_id = self.engine.get_next_available_stream_id()
        stream = QuicStream(self, stream_id, scope)
        self.streams[stream_id] = stream
        self.engine.read_offsets.setdefault(stream_id, 0)
        # the engine learns of the stream with its first write: reserve the id now
        self.engine.send_stream_data(stream_id, b"")
        await trio.lowlevel.checkpoint()
        return stream

    async def accept_stream(self) -> QuicStream:
        """The next stream the peer opened; ConnectionClosed once the connection is over."""
        try:
            return await self._accept_receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise ConnectionClosed("QUIC connection is closed") from None

    @property
    def num_streams(self) -> int:
        return len(self.streams)

    def loss(self) -> PathLoss:
        """What QUIC declared lost of what we sent (a rebuilt packet is not declared lost), in all
        and lately in congestion avoidance, and what the peer rebuilt; ``repaired`` once the peer
        speaks repairs."""
        congestion = self.engine.congestion
        return PathLoss(sent=congestion.bytes_sent, lost=congestion.bytes_lost, repaired=self._encoder is not None,
                        steady=congestion.steady.recent(), rebuilt=congestion.bytes_repaired)

    def repair_stats(self) -> dict:
        """What repairs did on this connection (zeros while the peer has not said it speaks them)."""
        encoder, decoder = self._encoder, self._decoder
        return {
            "repairs": encoder is not None,
            "blocks_sent": encoder.blocks if encoder else 0,
            "repairs_sent": encoder.repairs_sent if encoder else 0,
            "rebuilt": decoder.rebuilt if decoder else 0,
            "rebuilt_by_peer": self._peer_rebuilt,
            "unrepairable": decoder.unrepairable if decoder else 0,
            "declared_lost": self.engine.congestion.lost_total,
            "members_sent": encoder.members if encoder else 0,
            "congestion_window": self.engine.congestion.congestion_window,
            "slow_start_threshold": self.engine.congestion.ssthresh,
            "window_cuts": dict(self.engine.congestion.cuts),
        }

    def _check_open(self) -> None:
        if self.closed.is_set():
            if isinstance(self.close_reason, ConnectionClosed):
                raise ConnectionClosed(str(self.close_reason))
            raise ConnectionLost(str(self.close_reason or "QUIC connection is closed"))

    async def aclose(self) -> None:
        """Close the connection (CONNECTION_CLOSE, no error) and end every stream."""
        if not self.closed.is_set():
            self.engine.close()
            self.flush()
            self._terminate(ConnectionClosed("QUIC connection closed by us"))
        await trio.lowlevel.checkpoint()

    def abort(self, reason: BaseException) -> None:
        """End the connection now (a failed or timed-out handshake): tell the peer, drop everything."""
        if not self.closed.is_set():
            self.engine.close(error_code=0x1, reason_phrase=str(reason)[:100])
            self.flush()
            self._terminate(reason)

    def _terminate(self, reason: BaseException) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        self._timer_changed.set()
        lost = StreamReset(f"QUIC connection ended: {reason}")
        for stream in list(self.streams.values()):
            stream._on_reset(lost)
            stream._release_scope()
        self.streams.clear()
        self._accept_send.close()
        self._progress.unpark_all()
        for _, answered in self._pings.values():
            answered.set()
        self._pings.clear()
        if self._scope is not None:
            self._scope.close()
        for callback in self._on_closed:
            callback(self)
        self._on_closed.clear()

    async def wait_handshake(self) -> PeerID:
        """The peer's ID once the handshake (and the certificate check) is done; HandshakeError
        when the connection ends first. The caller bounds the wait."""
        async with trio.open_nursery() as nursery:

            async def watch_close() -> None:
                await self.closed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_close)
            await self.handshake_done.wait()
            nursery.cancel_scope.cancel()
        if self._remote_peer is None:
            reason = self.close_reason
            if isinstance(reason, HandshakeError):
                raise reason
            raise HandshakeError(f"QUIC handshake with {self.remote[0]}:{self.remote[1]} failed: {reason}")
        return self._remote_peer

    @property
    def remote_peer(self) -> PeerID:
        """The authenticated peer (HandshakeError before the handshake is done)."""
        if self._remote_peer is None:
            raise HandshakeError("the QUIC handshake is not done")
        return self._remote_peer

    @property
    def remote_public_key(self) -> PublicKey:
        """The peer's host key, from its certificate."""
        if self._remote_public_key is None:
            raise HandshakeError("the QUIC handshake is not done")
        return self._remote_public_key

    def check_expected(self, expected: PeerID | None) -> None:
        """PeerIDMismatch when the authenticated peer is not ``expected``."""
        if expected is not None and self._remote_peer != expected:
            raise PeerIDMismatch.between(expected, self.remote_peer)

    def __repr__(self) -> str:
        who = self._remote_peer.short() if self._remote_peer else "?"
        return f"QuicSession({who} at {self.remote[0]}:{self.remote[1]})"


__all__ = ["QuicSession"]
