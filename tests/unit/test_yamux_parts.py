"""A data frame that arrives over several reads is handed over in parts, never buffered whole."""

from __future__ import annotations

import pytest

from volunteer.net.yamux.frames import DATA, FIN, encode_header
from volunteer.net.yamux.session import (
    PAYLOAD_PART_MIN,
    DataReceived,
    Session,
    StreamEOF,
    StreamOpened,
    StreamReset,
    YamuxConfig,
)


def established(config=None) -> tuple[Session, Session, int]:
    """A client and a server session with one accepted stream, its ACK delivered."""
    client, server = Session(True, config), Session(False, config)
    sid = client.open_stream(0)
    server.receive_data(client.data_to_send(), 0)
    server.accept_stream(sid)
    client.receive_data(server.data_to_send(), 0)
    return client, server, sid


def kinds(events):
    return [type(e) for e in events]


@pytest.mark.parametrize("buffer_type", [bytes, bytearray])
def test_a_frame_over_three_reads_comes_in_parts_and_its_fin_after_the_last(buffer_type):
    client, server, sid = established()
    payload = bytes(range(256)) * 800  # 200 KiB: within the initial window, one frame
    client.send_data(sid, payload)
    client.close_write(sid)
    wire = client.data_to_send()
    cuts = [0, 12 + PAYLOAD_PART_MIN, 12 + 3 * PAYLOAD_PART_MIN, len(wire)]
    events = []
    for start, end in zip(cuts, cuts[1:]):
        got = server.receive_data(buffer_type(wire[start:end]), 0)
        assert len(server._inbound) == 0  # nothing held back: each part went to the stream
        events.append(got)
    assert [kinds(got) for got in events[:2]] == [[DataReceived], [DataReceived]]
    assert kinds(events[2])[-1] is StreamEOF  # the FIN (a frame of its own) only after all the data
    parts = [e.data for got in events for e in got if isinstance(e, DataReceived)]
    assert all(type(part) is bytes for part in parts)
    assert b"".join(parts) == payload
    assert server.streams[sid].recv_credit == 256 * 1024 - len(payload)


def test_fin_on_the_data_frame_itself_waits_for_its_last_part():
    client, server, sid = established()
    frame = encode_header(DATA, FIN, sid, 3 * PAYLOAD_PART_MIN) + b"x" * (3 * PAYLOAD_PART_MIN)
    first = server.receive_data(frame[: 12 + 2 * PAYLOAD_PART_MIN], 0)
    assert kinds(first) == [DataReceived]
    assert not server.streams[sid].remote_fin
    rest = server.receive_data(frame[12 + 2 * PAYLOAD_PART_MIN :], 0)
    assert kinds(rest) == [DataReceived, StreamEOF]
    assert sum(len(e.data) for e in first + rest if isinstance(e, DataReceived)) == 3 * PAYLOAD_PART_MIN


def test_a_small_partial_frame_still_waits_for_the_whole():
    client, server, sid = established()
    client.send_data(sid, b"y" * 1000)
    wire = client.data_to_send()
    assert server.receive_data(wire[:500], 0) == []
    events = server.receive_data(wire[500:], 0)
    assert kinds(events) == [DataReceived] and events[0].data == b"y" * 1000


def test_a_stream_reset_between_parts_skips_the_rest_of_its_frame_only():
    client, server, sid = established()
    other = client.open_stream(0)
    server.receive_data(client.data_to_send(), 0)
    server.accept_stream(other)
    client.send_data(sid, b"a" * (4 * PAYLOAD_PART_MIN))
    client.send_data(other, b"after")
    wire = client.data_to_send()
    cut = 12 + PAYLOAD_PART_MIN
    assert kinds(server.receive_data(wire[:cut], 0)) == [DataReceived]
    server.reset(sid)  # our application aborts the stream mid-frame
    dropped = server.dropped_frames
    events = server.receive_data(wire[cut:], 0)
    # the rest of the aborted stream's frame is passed over; the next frame is parsed as ever
    assert [(type(e), e.stream_id) for e in events] == [(DataReceived, other)] and events[0].data == b"after"
    assert server.dropped_frames == dropped and not server.terminated


def test_a_part_refused_by_the_memory_budget_resets_that_stream_alone():
    class Budget:
        """Takes the first part and refuses the rest."""

        def __init__(self) -> None:
            self.reserved = 0

        def reserve_memory(self, amount, *, now):
            if self.reserved:
                return False
            self.reserved = amount
            return True

        def release_memory(self, amount):
            self.reserved -= amount

        def close(self):
            pass

    client, server, sid = established(YamuxConfig())
    server.streams[sid].budget = Budget()
    client.send_data(sid, b"b" * (3 * PAYLOAD_PART_MIN))
    wire = client.data_to_send()
    cut = 12 + PAYLOAD_PART_MIN
    assert kinds(server.receive_data(wire[:cut], 0)) == [DataReceived]
    events = server.receive_data(wire[cut:], 0)
    assert kinds(events) == [StreamReset] and sid not in server.streams and not server.terminated


def test_a_new_stream_opened_by_a_partial_data_frame():
    client, server = Session(True), Session(False)
    sid = client.open_stream(0)
    client.send_data(sid, b"c" * (2 * PAYLOAD_PART_MIN))  # SYN rides on a window update, data follows
    wire = client.data_to_send()
    first = server.receive_data(wire[: 12 + 12 + PAYLOAD_PART_MIN], 0)
    assert kinds(first) == [StreamOpened, DataReceived]
    rest = server.receive_data(wire[12 + 12 + PAYLOAD_PART_MIN :], 0)
    assert kinds(rest) == [DataReceived]
    assert sum(len(e.data) for e in first + rest if isinstance(e, DataReceived)) == 2 * PAYLOAD_PART_MIN
