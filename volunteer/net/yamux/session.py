"""yamux session state machine (sans-I/O): bytes and ``now`` in, events and bytes out.

Flow control follows go-yamux: each stream grants the peer a receive window (256 KiB at first);
when the application has consumed half of it we send a window update, and if that happens in
less than four round trips (of the previous update, or of the first byte of a burst that found
the stream drained) the window doubles, up to 16 MiB, so a fast link is not throttled by a
small window. A peer that sends beyond the window it was granted breaks the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import LocalProtocolError, RemoteProtocolError, ResourceLimitExceeded
from .. import limits
from .budget import ConnectionBudget, StreamBudget
from .state import Opening, Phase, StreamState  # re-exported: tests look at a stream's phase
from .frames import (
    ACK,
    DATA,
    FIN,
    GO_AWAY,
    GO_AWAY_NORMAL,
    GO_AWAY_PROTOCOL_ERROR,
    HEADER,
    HEADER_SIZE,
    PING,
    RST,
    SYN,
    WINDOW_UPDATE,
    decode_header,
    encode_header,
)

# A data frame whose payload has only partly arrived is handed to its stream in parts once this
# much of it is here, instead of being buffered whole: a 1 MiB frame spans several socket reads,
# and buffering it copied most received bytes one extra time. Smaller pieces wait for the rest
# (one event per frame, as before) so that small frames do not turn into many tiny events.
PAYLOAD_PART_MIN = 16 * 1024


@dataclass
class YamuxConfig:
    """Bounds of one yamux session (defaults from volunteer.net.limits)."""

    initial_window: int = limits.YAMUX_INITIAL_WINDOW
    max_window: int = limits.YAMUX_MAX_WINDOW
    max_streams: int = limits.YAMUX_MAX_STREAMS
    accept_backlog: int = limits.YAMUX_ACCEPT_BACKLOG
    max_unacked_outbound: int = limits.YAMUX_ACCEPT_BACKLOG
    keepalive_interval: float = limits.YAMUX_KEEPALIVE_INTERVAL
    ping_timeout: float = limits.YAMUX_PING_TIMEOUT
    max_frame_payload: int = 1 << 20  # our data frames: at most this much per frame
    # Header-only frames (window updates, PING ACKs, RSTs) queued and not yet taken by the
    # writer: a peer that makes us queue more while not reading them is flooding us.
    max_control_outbox: int = limits.YAMUX_MAX_CONTROL_OUTBOX


# --- events ---------------------------------------------------------------------------------


class Event:
    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int = 0) -> None:
        self.stream_id = stream_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.stream_id})"


class StreamOpened(Event):
    """The peer opened a stream (SYN)."""


class DataReceived(Event):
    __slots__ = ("data",)

    def __init__(self, stream_id: int, data: bytes) -> None:
        super().__init__(stream_id)
        self.data = data


class StreamEOF(Event):
    """The peer finished sending on this stream (FIN)."""


class StreamReset(Event):
    """The peer reset this stream (RST), or refused to open it."""


class WindowUpdated(Event):
    """We may send more on this stream (or it was acknowledged)."""


class PingAcked(Event):
    __slots__ = ("rtt",)

    def __init__(self, rtt: float) -> None:
        super().__init__(0)
        self.rtt = rtt


class GoAwayReceived(Event):
    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        super().__init__(0)
        self.code = code


class ConnectionTerminated(Event):
    """The session is over (our protocol error detection, or GoAway with an error)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        super().__init__(0)
        self.error = error


class Session:
    """One side of a yamux connection. ``is_client`` picks odd stream IDs."""

    def __init__(
        self, is_client: bool, config: YamuxConfig | None = None, now: float = 0.0, budget: ConnectionBudget | None = None
    ) -> None:
        self.is_client = is_client
        self.config = config or YamuxConfig()
        # This connection's memory budget: every stream's slot and receive window is reserved
        # there first (None: unaccounted, as in the paired-core tests).
        self.budget = budget
        self.streams: dict[int, StreamState] = {}
        self._next_id = 1 if is_client else 2
        self._outbox: list[bytes] = []
        self._control_queued = 0  # bytes of header-only frames in the outbox
        self._inbound = bytearray()
        # The data frame being delivered in parts: its stream, payload bytes still to come, and
        # whether its FIN applies once they have (see PAYLOAD_PART_MIN).
        self._part_stream = 0
        self._part_left = 0
        self._part_fin = False
        self._pending_accept = 0  # inbound streams not yet accepted by the application
        self._unacked_outbound = 0
        self._pings: dict[int, float] = {}
        self._ping_ids = 0
        self.rtt: float | None = None
        self.local_go_away = False
        self.remote_go_away = False
        self.terminated = False
        self.dropped_frames = 0  # frames for streams we no longer know (after RST): counted, ignored

    # --- output ------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        if not self._outbox:
            return b""
        out = b"".join(self._outbox)
        self._outbox.clear()
        self._control_queued = 0
        return out

    def take_outbox(self) -> list[bytes]:
        """The pending output as a list (avoids one copy of big payloads)."""
        out, self._outbox = self._outbox, []
        self._control_queued = 0
        return out

    @property
    def has_output(self) -> bool:
        return bool(self._outbox)

    @property
    def queued_frames(self) -> int:
        """Parts (headers and payloads) waiting in the outbox: a driver compares it before and
        after a call to learn whether that call queued something to send."""
        return len(self._outbox)

    @property
    def control_queued(self) -> int:
        """Bytes of header-only frames waiting in the outbox."""
        return self._control_queued

    def _emit(self, frame_type: int, flags: int, stream_id: int, length: int, payload=None) -> None:
        self._outbox.append(HEADER.pack(0, frame_type, flags, stream_id, length))
        if payload is not None:
            self._outbox.append(payload)
        else:
            self._control_queued += HEADER_SIZE

    # --- streams -----------------------------------------------------------------------------
    def open_stream(self, now: float) -> int:
        if self.terminated:
            raise LocalProtocolError("yamux session is closed")
        if self.local_go_away or self.remote_go_away:
            raise LocalProtocolError("yamux session is going away: no new streams")
        if len(self.streams) >= self.config.max_streams:
            raise ResourceLimitExceeded(f"too many yamux streams ({self.config.max_streams})")
        if self._unacked_outbound >= self.config.max_unacked_outbound:
            raise ResourceLimitExceeded("too many streams waiting for the peer's acknowledgement")
        stream_id = self._next_id
        if stream_id >= 1 << 32:
            raise LocalProtocolError("yamux stream IDs exhausted")
        stream_budget = None
        if self.budget is not None:
            stream_budget = self.budget.open_stream(False, now=now)
            if stream_budget is None:
                raise ResourceLimitExceeded("the memory budget refused a new outbound stream")
        self._next_id += 2
        state = StreamState(stream_id, self.config.initial_window, now, Opening.SYN_SENT, stream_budget)
        self.streams[stream_id] = state
        self._unacked_outbound += 1
        # Announce at once (go-yamux does): SYN on a window update carrying any window growth.
        self._emit(WINDOW_UPDATE, SYN, stream_id, state.recv_window - limits.YAMUX_INITIAL_WINDOW)
        state.recv_credit = state.recv_window
        return stream_id

    def can_open_stream(self) -> bool:
        return self._unacked_outbound < self.config.max_unacked_outbound

    def accept_stream(self, stream_id: int) -> None:
        """The application took an inbound stream: queue its acknowledgement.

        The ACK needs no flush of its own: the driver lets it ride with the stream's first write
        (inbound negotiation always answers at once), saving one socket write per call."""
        state = self.streams.get(stream_id)
        if state is None or state.opening is not Opening.SYN_RECEIVED:
            return
        state.opening = Opening.ESTABLISHED
        self._pending_accept -= 1
        if not state.reset:
            grow = state.recv_window - limits.YAMUX_INITIAL_WINDOW
            state.recv_credit += grow
            self._emit(WINDOW_UPDATE, ACK, stream_id, grow)

    def send_window(self, stream_id: int) -> int:
        state = self.streams.get(stream_id)
        return state.send_window if state is not None else 0

    def send_data(self, stream_id: int, data) -> int:
        """Queue as much of ``data`` as the peer's window allows; returns bytes accepted."""
        state = self._writable(stream_id)
        count = min(len(data), state.send_window)
        if count <= 0 and len(data):
            return 0
        max_frame = self.config.max_frame_payload
        view = memoryview(data)
        sent = 0
        while sent < count:
            size = min(count - sent, max_frame)
            self._emit(DATA, 0, stream_id, size, view[sent : sent + size])
            sent += size
        state.send_window -= count
        return count

    def _writable(self, stream_id: int) -> StreamState:
        state = self.streams.get(stream_id)
        if state is None or state.reset:
            raise LocalProtocolError(f"yamux stream {stream_id} is reset or unknown")
        if state.local_fin:
            raise LocalProtocolError(f"yamux stream {stream_id} is closed for writing")
        if self.terminated:
            raise LocalProtocolError("yamux session is closed")
        return state

    def close_write(self, stream_id: int) -> None:
        state = self.streams.get(stream_id)
        if state is None or state.reset or state.local_fin:
            return
        state.finish_local()
        self._emit(WINDOW_UPDATE, FIN, stream_id, 0)
        self._maybe_forget(state)

    def stop_reading(self, stream_id: int) -> None:
        """Our application closed the stream: it will read nothing more. Data the peer sends after
        this resets the stream (as go-yamux does), so the peer's writer learns it at once instead of
        filling its window and waiting for ever."""
        state = self.streams.get(stream_id)
        if state is not None:
            state.reading = False

    def reset(self, stream_id: int) -> None:
        state = self.streams.get(stream_id)
        if state is None or state.reset:
            return
        self._emit(WINDOW_UPDATE, RST, stream_id, 0)
        self._drop(state)

    def consume(self, stream_id: int, count: int, now: float) -> None:
        """The application read ``count`` bytes of this stream: grant the peer more window."""
        state = self.streams.get(stream_id)
        if state is None or state.reset:
            return
        if state.budget is not None:
            state.budget.release_memory(count)  # reserved when it arrived
        if state.remote_fin:
            return
        state.consumed += count
        if state.consumed < state.recv_window // 2:
            return
        grow = 0
        rtt = self.rtt
        if rtt is not None and now - state.last_update < 4 * rtt and state.recv_window < self.config.max_window:
            # Half the window drained within a few round trips (go-yamux uses 4): the window is what
            # limits throughput. Double it.
            new_window = min(state.recv_window * 2, self.config.max_window)
            grow = new_window - state.recv_window
            state.recv_window = new_window
        delta = state.consumed + grow
        state.consumed = 0
        state.recv_credit += delta
        state.last_update = now
        self._emit(WINDOW_UPDATE, 0, stream_id, delta)

    def _drop(self, state: StreamState) -> None:
        state.phase = Phase.RESET
        self._forget(state)

    def _maybe_forget(self, state: StreamState) -> None:
        if state.closed:
            self._forget(state)

    def _forget(self, state: StreamState) -> None:
        if self.streams.pop(state.stream_id, None) is None:
            return
        if state.budget is not None:
            state.budget.close()
        if state.opening is Opening.SYN_RECEIVED:
            self._pending_accept -= 1
        elif state.opening is Opening.SYN_SENT:
            self._unacked_outbound -= 1

    def release_resources(self) -> None:
        """Give every stream's reservation and the connection's own back (the session is over;
        the driver calls this)."""
        for state in self.streams.values():
            if state.budget is not None:
                state.budget.close()
        if self.budget is not None:
            self.budget.close()

    def stream_budget(self, stream_id: int) -> StreamBudget | None:
        """The memory budget of a live stream (None when unknown or unaccounted)."""
        state = self.streams.get(stream_id)
        return state.budget if state is not None else None

    def is_ours(self, stream_id: int) -> bool:
        """Whether ``stream_id`` is of our parity (a stream we open; the peer opens the others)."""
        return (stream_id % 2 == 1) == self.is_client

    # --- ping / go away ---------------------------------------------------------------------
    def ping(self, now: float) -> int:
        self._ping_ids = (self._ping_ids + 1) & 0xFFFFFFFF
        self._pings[self._ping_ids] = now
        if len(self._pings) > 16:  # unanswered pings: keep only the newest few
            del self._pings[min(self._pings)]
        self._emit(PING, SYN, 0, self._ping_ids)
        return self._ping_ids

    def go_away(self, code: int = GO_AWAY_NORMAL) -> None:
        if self.local_go_away:
            return
        self.local_go_away = True
        self._emit(GO_AWAY, 0, 0, code)

    # --- input -------------------------------------------------------------------------------
    def receive_data(self, data, now: float) -> list[Event]:
        """Parse frames; a protocol violation queues GoAway(protocol error) and ends the session."""
        if self.terminated:
            return []
        if self._inbound:
            self._inbound += data
            source = self._inbound
        else:
            source = data  # parse straight from the input; only a partial frame is kept
        # Payloads handed to the application are bytes, copied once: slicing bytes copies, and
        # anything else (a bytearray from Noise, our own partial-frame buffer) is sliced through
        # a memoryview so that it is not copied twice.
        view = None if type(source) is bytes else memoryview(source)
        events: list[Event] = []
        pos = 0
        end = len(source)
        max_window = self.config.max_window
        try:
            if self._part_left:
                # the rest (or more) of a data frame's payload; nothing is buffered meanwhile
                take = min(self._part_left, end)
                payload = source[:take] if view is None else bytes(view[:take])
                pos = take
                self._part_left -= take
                self._on_payload_part(payload, now, events)
            while end - pos >= HEADER_SIZE:
                frame_type, flags, stream_id, length = decode_header(source, pos)
                if frame_type == DATA:
                    if length > max_window:
                        raise RemoteProtocolError(f"yamux data frame of {length} bytes exceeds any window")
                    if length and not flags & (SYN | RST):
                        # Judge a window violation from the header: never buffer a payload we will refuse.
                        state = self.streams.get(stream_id)
                        if state is not None and not state.remote_fin and length > state.recv_credit:
                            raise RemoteProtocolError(
                                f"yamux window violation on stream {stream_id}: {length} bytes > {state.recv_credit} granted"
                            )
                    if end - pos - HEADER_SIZE < length:
                        available = end - pos - HEADER_SIZE
                        if available < PAYLOAD_PART_MIN:
                            break
                        # Deliver what is here; the rest follows in later calls (_on_payload_part).
                        start = pos + HEADER_SIZE
                        payload = source[start:end] if view is None else bytes(view[start:end])
                        pos = end
                        self._part_stream, self._part_left, self._part_fin = stream_id, length - available, bool(flags & FIN)
                        self._on_data(stream_id, flags & ~FIN, payload, now, events)
                        break
                    start = pos + HEADER_SIZE
                    payload = source[start : start + length] if view is None else bytes(view[start : start + length])
                    pos = start + length
                    self._on_data(stream_id, flags, payload, now, events)
                else:
                    pos += HEADER_SIZE
                    if frame_type == WINDOW_UPDATE:
                        self._on_window_update(stream_id, flags, length, now, events)
                    elif frame_type == PING:
                        self._on_ping(flags, length, now, events)
                    else:
                        self._on_go_away(length, events)
                    if self._control_queued > self.config.max_control_outbox:
                        if self.budget is not None:
                            self.budget.refuse("control_outbox", now=now)
                        raise RemoteProtocolError(
                            f"yamux control-frame flood: {self._control_queued} bytes of replies queued, unread"
                        )
                if self.terminated:
                    break
        except RemoteProtocolError as exc:
            pos = end  # the session is over: keep none of what the peer sent
            self._part_left = 0
            self.go_away(GO_AWAY_PROTOCOL_ERROR)
            self.terminated = True
            events.append(ConnectionTerminated(exc))
        finally:
            if view is not None:
                view.release()  # before resizing _inbound, which a live view would forbid
            # Bounded: what stays is at most a header plus one max-window payload.
            if source is self._inbound:
                if pos:
                    del self._inbound[:pos]
            elif pos < end:
                self._inbound = bytearray(source[pos:])
        return events

    def _on_stream_flags(self, stream_id: int, flags: int, now: float, events: list[Event]) -> StreamState | None:
        """Handle SYN/ACK/RST common to DATA and WINDOW_UPDATE. Returns the live stream or None."""
        if stream_id == 0:
            raise RemoteProtocolError("yamux stream frame with stream id 0")
        state = self.streams.get(stream_id)
        if flags & SYN:
            if state is not None or self.is_ours(stream_id):
                raise RemoteProtocolError(f"yamux SYN for stream {stream_id} which exists or has our parity")
            if self.local_go_away or self.remote_go_away or len(self.streams) >= self.config.max_streams or (
                self._pending_accept >= self.config.accept_backlog
            ):
                # Refuse: the backlog of streams nobody accepted yet is full (or we are going away).
                self._emit(WINDOW_UPDATE, RST, stream_id, 0)
                return None
            stream_budget = None
            if self.budget is not None:
                stream_budget = self.budget.open_stream(True, now=now)
                if stream_budget is None:
                    # Refused by the budget (streams or memory of this peer or node): RST.
                    self._emit(WINDOW_UPDATE, RST, stream_id, 0)
                    return None
            state = StreamState(stream_id, self.config.initial_window, now, Opening.SYN_RECEIVED, stream_budget)
            self.streams[stream_id] = state
            self._pending_accept += 1
            events.append(StreamOpened(stream_id))
        if state is None:
            self.dropped_frames += 1
            return None
        if flags & ACK and state.opening is Opening.SYN_SENT:
            state.opening = Opening.ESTABLISHED
            self._unacked_outbound -= 1
            events.append(WindowUpdated(stream_id))
        if flags & RST:
            self._drop(state)
            events.append(StreamReset(stream_id))
            return None
        return state

    def _on_data(self, stream_id: int, flags: int, payload: bytes, now: float, events: list[Event]) -> None:
        state = self._on_stream_flags(stream_id, flags, now, events)
        if state is None:
            return
        self._accept_payload(state, payload, now, events)
        if flags & FIN and not state.reset:
            self._on_fin(state, events)

    def _on_payload_part(self, payload: bytes, now: float, events: list[Event]) -> None:
        """A later part of the data frame started in an earlier call: its flags were handled with
        the first part; its FIN, if any, applies after the last. A stream reset or dropped in
        between takes no more of it (and counts no dropped frame: the frame was counted once)."""
        state = self.streams.get(self._part_stream)
        if state is None or state.reset:
            return
        self._accept_payload(state, payload, now, events)
        if not self._part_left and self._part_fin and not state.reset:
            self._on_fin(state, events)

    def _accept_payload(self, state: StreamState, payload: bytes, now: float, events: list[Event]) -> None:
        """Hand ``payload`` to its stream, within its window and its memory budget."""
        stream_id = state.stream_id
        if payload:
            if state.remote_fin or not state.reading:
                # Data after the peer's FIN breaks this stream, not the connection; data after
                # we stopped reading has nobody to read it. Either way: reset the stream alone.
                self._emit(WINDOW_UPDATE, RST, stream_id, 0)
                self._drop(state)
                events.append(StreamReset(stream_id))
                return
            if len(payload) > state.recv_credit:
                raise RemoteProtocolError(
                    f"yamux window violation on stream {stream_id}: {len(payload)} bytes > {state.recv_credit} granted"
                )
            if state.budget is not None and not state.budget.reserve_memory(len(payload), now=now):
                # Unread data of this peer (or of all peers) is at its memory limit: this stream
                # goes, its bytes with it; the connection and the peer's other streams stay.
                self._emit(WINDOW_UPDATE, RST, stream_id, 0)
                self._drop(state)
                events.append(StreamReset(stream_id))
                return
            if state.recv_window - state.recv_credit == state.consumed:
                # Nothing unread: a burst starts. Time the drain from here, not from an update
                # long ago: a pooled request/reply stream idles between calls, and its window
                # would never grow however fast each call is read (a call larger than the
                # window waits for an update in mid-call, a write and a wake-up on both sides).
                state.last_update = now
            state.recv_credit -= len(payload)
            events.append(DataReceived(stream_id, payload))

    def _on_window_update(self, stream_id: int, flags: int, delta: int, now: float, events: list[Event]) -> None:
        state = self._on_stream_flags(stream_id, flags, now, events)
        if state is None:
            return
        if delta:
            state.send_window += delta
            if state.send_window > 1 << 32:
                raise RemoteProtocolError("yamux send window overflow")
            events.append(WindowUpdated(stream_id))
        if flags & FIN:
            self._on_fin(state, events)

    def _on_fin(self, state: StreamState, events: list[Event]) -> None:
        if state.remote_fin:
            return
        state.finish_remote()
        events.append(StreamEOF(state.stream_id))
        self._maybe_forget(state)

    def _on_ping(self, flags: int, opaque: int, now: float, events: list[Event]) -> None:
        if flags & SYN:
            self._emit(PING, ACK, 0, opaque)
        elif flags & ACK:
            sent = self._pings.pop(opaque, None)
            if sent is not None:
                self.rtt = now - sent
                events.append(PingAcked(self.rtt))

    def _on_go_away(self, code: int, events: list[Event]) -> None:
        self.remote_go_away = True
        events.append(GoAwayReceived(code))
        if code != GO_AWAY_NORMAL:
            self.terminated = True
            events.append(ConnectionTerminated(RemoteProtocolError(f"peer sent GoAway with error code {code}")))
