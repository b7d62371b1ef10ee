"""Our congestion control, pacer and loss detection over aioquic's (transport/quic/congestion.py),
without sockets: sparse loss is noise only while repairs are on, a repaired loss keeps them on,
a rebuilt packet is not given up for lost before its block's repairs could arrive, and pacing
sends a window in half a round trip during slow start."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aioquic.quic.congestion.base import K_INITIAL_WINDOW
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch

from volunteer.net import limits
from volunteer.net.transport.quic.congestion import AccountedCubic, LinuxLikePacer, RepairAwareReno
from volunteer.net.transport.quic.settings import CONGESTION_CONTROLS, QuicLimits

from .test_quic_core import CLIENT_ADDR, LIMITS, SERVER_ADDR, engines, exchange

SIZE = 1400


def packet(number: int, now: float = 0.5) -> QuicSentPacket:
    return QuicSentPacket(epoch=Epoch.ONE_RTT, in_flight=True, is_ack_eliciting=True, is_crypto_packet=False,
                          packet_number=number, packet_type=QuicPacketType.ONE_RTT, sent_time=now, sent_bytes=SIZE)


def sent(cc: RepairAwareReno, count: int, first: int = 0) -> list[QuicSentPacket]:
    packets = [packet(first + i) for i in range(count)]
    for p in packets:
        cc.on_packet_sent(packet=p)
    return packets


def test_sparse_loss_cuts_the_window_only_while_repairs_are_off():
    plain, repaired = RepairAwareReno(max_datagram_size=SIZE), RepairAwareReno(max_datagram_size=SIZE)
    repaired.tolerate(True)
    for cc in (plain, repaired):
        packets = sent(cc, 400)
        cc.on_packets_lost(now=1.0, packets=packets[:2])  # 0.5 %: a lossy line, not a full queue
    assert plain.congestion_window < repaired.congestion_window == K_INITIAL_WINDOW * SIZE
    assert plain.cuts["untolerated"] == 1 and repaired.cuts == {"untolerated": 0, "beyond_tolerance": 0, "persistent": 0}
    assert repaired.bytes_in_flight == 398 * SIZE  # what was lost left the flight all the same


def test_loss_beyond_the_tolerance_is_congestion_even_with_repairs():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    cc.tolerate(True)
    packets = sent(cc, 200)
    window = cc.congestion_window
    cc.on_packets_lost(now=1.0, packets=packets[:20])  # 10 %: a queue overflowing
    assert cc.congestion_window < window and cc.cuts["beyond_tolerance"] == 1


def test_repairs_resume_slow_start_once_and_ignore_a_rising_round_trip():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    cc.on_packets_lost(now=1.0, packets=sent(cc, 10)[:1])  # the loss that turns repairs on
    assert cc.ssthresh is not None
    cc.tolerate(True)
    assert cc.ssthresh is None
    for step in range(40):  # round trips growing by half: HyStart would end slow start
        cc.on_rtt_measurement(now=step * 0.01, rtt=0.1 + step * 0.05)
    assert cc.ssthresh is None
    cc.tolerate(False)
    cc.ssthresh = 5 * SIZE
    cc.tolerate(True)
    assert cc.ssthresh == 5 * SIZE  # only once


def test_a_path_whose_losses_are_all_repaired_still_counts_as_losing():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    sent(cc, 100)
    assert not cc.losing
    cc.note_repaired(3)
    assert cc.losing and cc.loss_rate() == 0.0  # a repaired loss is no congestion
    sent(cc, 3 * limits.QUIC_LOSS_WINDOW)
    assert not cc.losing  # two windows later it is forgotten


def test_pacing_sends_twice_the_window_per_round_trip_in_slow_start():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    pacer = LinuxLikePacer(max_datagram_size=SIZE, congestion=cc)
    pacer.update_rate(congestion_window=100 * SIZE, smoothed_rtt=0.2)
    assert abs(pacer.packet_time - 0.2 / 200) < 1e-9
    cc.ssthresh = cc.congestion_window  # congestion avoidance
    pacer.update_rate(congestion_window=100 * SIZE, smoothed_rtt=0.2)
    assert abs(pacer.packet_time - 0.2 / 120) < 1e-9


def lost_after_a_gap(tolerant: bool, congestion: str = "ours") -> int:
    """Packets the client declares lost when the first of its next 10 datagrams never arrives
    (all sent and acknowledged well within a round trip: only the count can declare it lost)."""
    client, server = engines(quic_limits=replace(LIMITS, congestion=congestion))
    exchange(client, server, step=0.05)  # a 100 ms round trip
    client.congestion.tolerate(tolerant)
    stream_id = client.get_next_available_stream_id()
    client.send_stream_data(stream_id, bytes(12 * 1500))
    datagrams, now = [], 2.0
    while len(datagrams) < 10 and now < 2.04:  # the pacer lets a few out at a time
        datagrams += [data for data, _ in client.datagrams_to_send(now=now)]
        now += 0.0002
    assert len(datagrams) >= 10
    for data in datagrams[1:10]:
        server.receive_datagram(data, CLIENT_ADDR, now=now)
    now += 0.03  # the server's ACK delay, well within a round trip
    for data, _ in server.datagrams_to_send(now=now):
        client.receive_datagram(data, SERVER_ADDR, now=now)
    return client.congestion.lost_total


@pytest.mark.parametrize("congestion", CONGESTION_CONTROLS)
def test_with_repairs_a_gap_is_not_given_up_before_a_block_of_later_packets_is_acknowledged(congestion):
    assert lost_after_a_gap(tolerant=False, congestion=congestion) >= 1  # three later packets acknowledged: lost
    assert lost_after_a_gap(tolerant=True, congestion=congestion) == 0  # nine are not a block and three


def test_cubic_takes_every_declared_loss_for_congestion_even_with_repairs():
    """RFC 9265: loss that repairs hide is still a congestion signal; cubic counts as ours does."""
    cc = AccountedCubic(max_datagram_size=SIZE)
    cc.tolerate(True)
    packets = sent(cc, 400)
    assert cc.in_slow_start
    cc.on_packets_lost(now=1.0, packets=packets[:2])  # 0.5 %: what ours would tolerate
    assert not cc.in_slow_start and cc.cuts == {"loss": 1, "persistent": 0}
    assert cc.congestion_window == int(398 * SIZE * 0.7)  # RFC 9438: 0.7 of the flight
    assert cc.lost_total == 2 and cc.bytes_lost == 2 * SIZE and cc.loss_rate() == 2 / 400
    cc.note_repaired(3)
    assert cc.losing and cc.bytes_repaired == 3 * SIZE


def test_the_setting_chooses_the_controller_and_the_pacer():
    for congestion, kind in (("cubic", AccountedCubic), ("ours", RepairAwareReno)):
        client, server = engines(quic_limits=replace(LIMITS, congestion=congestion))
        assert type(client.congestion) is kind and type(server.congestion) is kind
        assert isinstance(client.congestion_controller, kind)
    ours, _ = engines(quic_limits=replace(LIMITS, congestion="ours"))
    cubic, _ = engines(quic_limits=replace(LIMITS, congestion="cubic"))
    assert isinstance(ours._loss._pacer, LinuxLikePacer) and not isinstance(cubic._loss._pacer, LinuxLikePacer)
    with pytest.raises(ValueError, match="one of cubic, ours"):
        QuicLimits(congestion="bbr")


def test_a_window_the_calls_do_not_fill_does_not_grow():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    start = cc.congestion_window
    for burst in range(20):  # bursts of 3 packets, acknowledged: a third of the window at most
        packets = sent(cc, 3, first=burst * 3)
        for p in packets:
            cc.on_packet_acked(now=1.0 + burst, packet=p)
    assert cc.congestion_window == start and cc.bytes_in_flight == 0
    packets = sent(cc, 9, first=100)  # a burst near the window: slow start grows it again
    for p in packets:
        cc.on_packet_acked(now=30.0, packet=p)
    assert cc.congestion_window > start


def test_what_a_slow_start_overshoots_stays_out_of_the_steady_count():
    """The steady count (what judges a repaired path, pathloss.PathLoss.hurts) takes only what
    was sent and lost in congestion avoidance; the whole count takes everything."""
    cc = RepairAwareReno(max_datagram_size=SIZE)
    overshoot = sent(cc, 40)
    assert cc.in_slow_start
    cc.on_packets_lost(now=0.6, packets=overshoot[:30])
    assert not cc.in_slow_start
    assert cc.bytes_lost == 30 * SIZE and cc.steady.lost == 0 and cc.steady.sent == 0
    later = sent(cc, 10, first=40)
    cc.on_packets_lost(now=0.9, packets=later[:1])
    assert cc.bytes_sent == 50 * SIZE and cc.bytes_lost == 31 * SIZE
    assert cc.steady.sent == 10 * SIZE and cc.steady.lost == SIZE


def test_what_the_peer_rebuilt_is_counted_in_bytes():
    cc = RepairAwareReno(max_datagram_size=SIZE)
    sent(cc, 10)
    assert cc.bytes_repaired == 0
    cc.note_repaired(2)
    cc.note_repaired(1)
    assert cc.bytes_repaired == 3 * SIZE


def test_the_environment_chooses_for_a_whole_process(monkeypatch):
    """benchmarks/wan.py --quic-congestion reaches every process it starts this way."""
    monkeypatch.setenv("VOLUNTEER_QUIC_CONGESTION", "ours")
    assert QuicLimits().congestion == "ours"
    monkeypatch.setenv("VOLUNTEER_QUIC_CONGESTION", "cubic")
    assert QuicLimits().congestion == "cubic"
    monkeypatch.delenv("VOLUNTEER_QUIC_CONGESTION")
    assert QuicLimits().congestion == "ours"  # measured the faster on lossy long paths
