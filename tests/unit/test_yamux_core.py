"""yamux session cores paired without sockets: streams, flow control, errors, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import LocalProtocolError
from volunteer.net.yamux.frames import ACK, DATA, FIN, GO_AWAY, PING, RST, SYN, WINDOW_UPDATE, encode_header
from volunteer.net.yamux.session import (
    ConnectionTerminated,
    DataReceived,
    GoAwayReceived,
    PingAcked,
    Session,
    StreamEOF,
    StreamOpened,
    StreamReset,
    WindowUpdated,
    YamuxConfig,
)


class Pair:
    def __init__(self, config=None):
        self.client = Session(True, config)
        self.server = Session(False, config)
        self.now = 0.0

    def to_server(self):
        return self.server.receive_data(self.client.data_to_send(), self.now)

    def to_client(self):
        return self.client.receive_data(self.server.data_to_send(), self.now)


def kinds(events):
    return [type(e) for e in events]


def test_open_send_fin_both_ways():
    pair = Pair()
    sid = pair.client.open_stream(0)
    assert sid == 1
    events = pair.to_server()
    assert kinds(events) == [StreamOpened]
    pair.server.accept_stream(sid)
    assert kinds(pair.to_client()) == [WindowUpdated]  # the ACK
    assert pair.client.send_data(sid, b"hello") == 5
    pair.client.close_write(sid)
    events = pair.to_server()
    assert kinds(events) == [DataReceived, StreamEOF] and events[0].data == b"hello"
    pair.server.send_data(sid, b"bye")
    pair.server.close_write(sid)
    events = pair.to_client()
    assert [e.data for e in events if isinstance(e, DataReceived)] == [b"bye"]
    assert sid not in pair.client.streams and sid not in pair.server.streams  # both sides closed


def test_stream_ids_have_parity():
    pair = Pair()
    assert [pair.client.open_stream(0) for _ in range(3)] == [1, 3, 5]
    assert [pair.server.open_stream(0) for _ in range(3)] == [2, 4, 6]


def test_flow_control_and_window_growth():
    pair = Pair()
    pair.client.rtt = 0.010
    sid = pair.client.open_stream(0)
    pair.to_server()
    pair.server.accept_stream(sid)
    pair.to_client()
    pair.server.rtt = 0.010
    big = b"x" * (1 << 20)
    sent = pair.client.send_data(sid, big)
    assert sent == 256 * 1024  # the initial window
    assert pair.client.send_data(sid, big) == 0
    events = pair.to_server()
    received = sum(len(e.data) for e in events if isinstance(e, DataReceived))
    assert received == sent
    # The application consumes it quickly (within 4 RTTs): the window doubles.
    pair.now = 0.001
    pair.server.consume(sid, received, pair.now)
    assert pair.server.streams[sid].recv_window == 512 * 1024
    pair.to_client()
    assert pair.client.send_window(sid) == 512 * 1024
    # Slow consumption keeps the window as it is.
    sent = pair.client.send_data(sid, big)
    pair.to_server()
    pair.now = 10.0
    pair.server.consume(sid, sent, pair.now)
    assert pair.server.streams[sid].recv_window == 512 * 1024


def test_window_grows_for_bursts_drained_fast_after_idle_gaps():
    # A pooled request/reply stream: a 256 KiB call, a minute idle, the next call. Each call is
    # drained within a few round trips of its first byte, so the window is what holds the sender
    # back (it waits for an update in mid-call): it grows, though the last update is a minute
    # old, and window updates (a write on both sides) come ever more rarely.
    pair = Pair()
    sid = pair.client.open_stream(0)
    pair.to_server()
    pair.server.accept_stream(sid)
    pair.to_client()
    pair.server.rtt = 0.010
    call = b"x" * (256 * 1024)
    windows, updates = [], 0
    for n in range(4):
        pair.now = 60.0 * (n + 1)
        assert pair.client.send_data(sid, call) == len(call)
        received = sum(len(e.data) for e in pair.to_server() if isinstance(e, DataReceived))
        pair.now += 0.001
        pair.server.consume(sid, received, pair.now)
        updates += sum(isinstance(e, WindowUpdated) for e in pair.to_client())
        windows.append(pair.server.streams[sid].recv_window)
    assert windows == [512 * 1024, 1024 * 1024, 1024 * 1024, 2048 * 1024]
    assert updates == 3  # none after the third call: half of the 1 MiB window was not drained yet
    # A burst drained slowly (past 4 round trips of its first byte) leaves the window as it is.
    pair.now = 600.0
    pair.client.send_data(sid, b"x" * (1024 * 1024))
    received = sum(len(e.data) for e in pair.to_server() if isinstance(e, DataReceived))
    pair.now += 1.0
    pair.server.consume(sid, received, pair.now)
    assert pair.server.streams[sid].recv_window == 2048 * 1024


def test_window_violation_is_a_protocol_error():
    pair = Pair()
    sid = pair.client.open_stream(0)
    pair.to_server()
    frame = encode_header(DATA, 0, sid, 300 * 1024) + b"\0" * (300 * 1024)
    events = pair.server.receive_data(frame, 0)
    assert isinstance(events[-1], ConnectionTerminated) and "window" in str(events[-1].error)
    assert pair.server.terminated
    assert pair.server.data_to_send()[:2] == bytes([0, GO_AWAY])


def test_rst_and_data_after_fin():
    pair = Pair()
    sid = pair.client.open_stream(0)
    pair.to_server()
    pair.server.reset(sid)
    assert kinds(pair.to_client()) == [StreamReset]
    with pytest.raises(LocalProtocolError):
        pair.client.send_data(sid, b"x")
    sid = pair.client.open_stream(0)
    pair.client.close_write(sid)
    pair.to_server()
    # Data after FIN breaks that stream only: it is reset, the connection lives on.
    events = pair.server.receive_data(encode_header(DATA, 0, sid, 1) + b"y", 0)
    assert kinds(events) == [StreamReset] and not pair.server.terminated
    bad = pair.client.receive_data(encode_header(WINDOW_UPDATE, FIN, 2, 0) + encode_header(DATA, 0, 2, 1) + b"z", 0)
    assert kinds(bad) == []  # unknown stream: dropped and counted
    assert pair.client.dropped_frames == 2


def test_backlog_refuses_unaccepted_streams():
    pair = Pair(YamuxConfig(accept_backlog=2, max_unacked_outbound=10))
    for _ in range(3):
        pair.client.open_stream(0)
    events = pair.to_server()
    assert kinds(events) == [StreamOpened, StreamOpened]
    assert kinds(pair.to_client()) == [StreamReset]


def test_unacked_outbound_limit():
    pair = Pair(YamuxConfig(max_unacked_outbound=2))
    pair.client.open_stream(0)
    pair.client.open_stream(0)
    assert not pair.client.can_open_stream()
    with pytest.raises(Exception):
        pair.client.open_stream(0)
    for event in pair.to_server():
        pair.server.accept_stream(event.stream_id)
    pair.to_client()
    assert pair.client.can_open_stream()


def test_ping_rtt_and_go_away():
    pair = Pair()
    pair.client.ping(1.0)
    pair.to_server()
    pair.now = 1.25
    events = pair.to_client()
    assert kinds(events) == [PingAcked] and events[0].rtt == pytest.approx(0.25)
    pair.server.go_away()
    assert kinds(pair.to_client()) == [GoAwayReceived]
    with pytest.raises(LocalProtocolError):
        pair.client.open_stream(0)


def test_bad_frames_terminate():
    for frame in (
        bytes([1, DATA, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),  # version 1
        bytes([0, 9, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),  # unknown type
        encode_header(WINDOW_UPDATE, SYN, 1, 0),  # SYN with the server's own... client parity at server is fine; at client it's ours
        encode_header(DATA, SYN, 0, 0),  # stream 0
    ):
        session = Session(True)
        events = session.receive_data(frame, 0)
        assert events and isinstance(events[-1], ConnectionTerminated), frame
    session = Session(True)
    events = session.receive_data(encode_header(GO_AWAY, 0, 0, 1), 0)
    assert isinstance(events[-1], ConnectionTerminated)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_crash(data):
    session = Session(False, YamuxConfig(max_window=64 * 1024))
    events = session.receive_data(data, 0.0)
    assert all(e.__class__.__module__.endswith("session") for e in events)
    assert len(session._inbound) <= 12 + 64 * 1024


frames = st.builds(
    lambda t, f, sid, payload: encode_header(t, f, sid, len(payload) if t == DATA else len(payload) * 100) + (payload if t == DATA else b""),
    st.sampled_from([DATA, WINDOW_UPDATE, PING, GO_AWAY]),
    st.sampled_from([0, SYN, ACK, FIN, RST, SYN | FIN]),
    st.integers(0, 6),
    st.binary(max_size=40),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=20))
def test_random_frame_sequences(sequence):
    session = Session(False)
    for frame in sequence:
        session.receive_data(frame, 0.0)
        if session.terminated:
            break
    session.data_to_send()
    assert len(session.streams) <= session.config.max_streams


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "send", "fin", "rst", "consume", "ping", "deliver"]), st.integers(0, 5)), max_size=40))
def test_random_api_sequences_between_a_pair(ops):
    pair = Pair()
    opened: list[int] = []
    for op, arg in ops:
        side = pair.client
        try:
            if op == "open":
                opened.append(side.open_stream(pair.now))
            elif op == "send" and opened:
                side.send_data(opened[arg % len(opened)], b"d" * (arg * 1000))
            elif op == "fin" and opened:
                side.close_write(opened[arg % len(opened)])
            elif op == "rst" and opened:
                side.reset(opened[arg % len(opened)])
            elif op == "consume" and opened:
                pair.server.consume(opened[arg % len(opened)], arg * 1000, pair.now)
            elif op == "ping":
                side.ping(pair.now)
        except LocalProtocolError:
            pass
        for event in pair.to_server():
            if isinstance(event, StreamOpened):
                pair.server.accept_stream(event.stream_id)
            assert not isinstance(event, ConnectionTerminated), event.error
        for event in pair.to_client():
            assert not isinstance(event, ConnectionTerminated), event.error
        pair.now += 0.001


# --- stream state, resource accounting and floods -------------------------------------------

from volunteer.net.resources import MEMORY, STREAMS_INBOUND, ResourceLimits, ResourceManager  # noqa: E402
from volunteer.net.yamux.session import Opening, Phase  # noqa: E402


def test_stream_state_is_two_enums_through_a_lifetime():
    pair = Pair()
    sid = pair.client.open_stream(0)
    assert pair.client.streams[sid].opening is Opening.SYN_SENT
    pair.to_server()
    assert pair.server.streams[sid].opening is Opening.SYN_RECEIVED
    pair.server.accept_stream(sid)
    pair.to_client()
    assert pair.client.streams[sid].opening is Opening.ESTABLISHED is pair.server.streams[sid].opening
    pair.client.close_write(sid)
    assert pair.client.streams[sid].phase is Phase.LOCAL_CLOSED
    pair.to_server()
    assert pair.server.streams[sid].phase is Phase.REMOTE_CLOSED
    pair.server.reset(sid)
    assert sid not in pair.server.streams
    pair.to_client()
    assert sid not in pair.client.streams


def scoped_server(**limits):
    manager = ResourceManager(ResourceLimits(connection_memory=0, **limits))
    scope = manager.open_connection("client", "/ip4/10.0.0.1/tcp/1", now=0)
    pair = Pair()
    pair.server = Session(False, budget=scope)
    return pair, manager


def test_unread_bytes_are_reserved_until_read_and_a_stream_past_the_budget_is_reset():
    pair, manager = scoped_server(peer_memory=300 * 1024)
    first, second = pair.client.open_stream(0), pair.client.open_stream(0)
    pair.to_server()
    pair.client.send_data(first, b"x" * 200 * 1024)
    events = pair.to_server()
    assert kinds(events) == [DataReceived] and manager.peer_memory("client") == 200 * 1024
    pair.client.send_data(second, b"y" * 200 * 1024)  # would take the peer past 300 KiB
    events = pair.to_server()
    assert kinds(events) == [StreamReset] and second not in pair.server.streams
    assert kinds(pair.to_client()) == [StreamReset]  # the sender learns it with an RST
    assert manager.refusals() == {"peer": {MEMORY: 1}}
    pair.server.consume(first, 150 * 1024, 0)  # the application read some
    assert manager.peer_memory("client") == 50 * 1024
    pair.server.reset(first)
    assert manager.peer_memory("client") == 0


def test_streams_past_the_peer_limit_are_refused_with_rst():
    pair, manager = scoped_server(peer_streams_inbound=2)
    for _ in range(3):
        pair.client.open_stream(0)
    events = pair.to_server()
    assert kinds(events) == [StreamOpened, StreamOpened]
    assert kinds(pair.to_client()) == [StreamReset]
    assert manager.refusals() == {"peer": {STREAMS_INBOUND: 1}}
    pair.server.release_resources()
    assert manager.system.in_use(STREAMS_INBOUND) == 0 and manager.memory == 0


def test_ping_flood_without_reading_terminates_the_session():
    pair, manager = scoped_server()
    flood = encode_header(PING, SYN, 0, 7) * 10000  # 120 KB of pings; replies are never read
    events = pair.server.receive_data(flood, 0)
    assert isinstance(events[-1], ConnectionTerminated) and "flood" in str(events[-1].error)
    assert pair.server.terminated
    assert pair.server.control_queued <= pair.server.config.max_control_outbox + 2 * 12
    assert manager.refusals() == {"connection": {"control_outbox": 1}}


def test_replies_taken_by_the_writer_do_not_count_as_a_flood():
    pair = Pair()
    for _ in range(50):
        pair.server.receive_data(encode_header(PING, SYN, 0, 7) * 1000, 0)
        assert pair.server.data_to_send()  # the writer keeps up: an honest, chatty peer
    assert not pair.server.terminated


def test_window_violation_is_judged_from_the_header():
    pair = Pair()
    sid = pair.client.open_stream(0)
    pair.to_server()
    header = encode_header(DATA, 0, sid, 1024 * 1024)  # 1 MiB announced, 256 KiB granted
    events = pair.server.receive_data(header + b"z" * 100, 0)  # only 100 bytes of it sent yet
    assert kinds(events) == [ConnectionTerminated] and "window violation" in str(events[0].error)
    assert len(pair.server._inbound) == 0  # nothing of the announced payload was buffered


@pytest.mark.parametrize("buffer_type", [bytes, bytearray, memoryview])
def test_payloads_are_bytes_whatever_buffer_the_input_came_in(buffer_type):
    """Noise may hand over a bytearray; the application still gets bytes, split or whole."""
    pair = Pair()
    sid = pair.client.open_stream(0)
    pair.to_server()
    pair.server.accept_stream(sid)
    pair.to_client()
    pair.client.send_data(sid, b"a" * 1000)
    pair.client.send_data(sid, b"b" * 10)
    wire = pair.client.data_to_send()
    received = []
    pieces = [wire[:5], wire[5:600], wire[600:]]  # a header split, a payload split, then the rest
    for piece in pieces:
        for event in pair.server.receive_data(buffer_type(piece), pair.now):
            assert type(event.data) is bytes
            received.append(event.data)
    assert b"".join(received) == b"a" * 1000 + b"b" * 10
