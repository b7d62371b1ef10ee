"""Where a trainer's calls spend their time (callstats), which encoding a link gets, and the
float16 encoding keeping values half cannot hold out of it."""

from __future__ import annotations

import pytest
import torch

from volunteer.experts.callstats import (
    AUTO,
    MIN_HALF_SAVING_S,
    MIN_RATE_SAMPLE_BYTES,
    MIN_WIRE_SAVING_S,
    CallReport,
    CallStats,
    choose_compression,
)
from volunteer.experts.tensors import BLOCKWISE8_64, FLOAT16, NONE, deserialize, encode


def report(**fields) -> CallReport:
    base = dict(op="forward", started=10.0, sent=10.2, first_reply=10.5, done=10.6, bytes_out=100, bytes_in=100,
                server_s=0.2)
    return CallReport(**{**base, **fields})


def test_a_report_splits_a_call_into_network_and_volunteer_time():
    r = report()
    assert r.total == pytest.approx(0.6)
    assert r.network_s == pytest.approx(0.4)
    assert r.rtt_sample == pytest.approx(0.1)  # 0.3 s from our last byte to the reply, 0.2 s of it the volunteer's
    unfinished = CallReport(started=1.0)
    assert unfinished.total is None and unfinished.network_s is None and unfinished.rtt_sample is None


def test_stats_sum_per_expert_and_host_and_keep_the_smallest_round_trip():
    stats = CallStats()
    stats.record("expert.0.1", "peerA", report(), "direct")
    stats.record("expert.0.1", "peerA", report(first_reply=10.9, done=11.0), "direct")
    stats.failed("expert.0.1", "peerA")
    stats.record("other.0", "peerB", report(), "relayed via X", rtt=0.14)
    [row] = stats.snapshot("expert")["expert.0.1"]
    assert (row["calls"], row["failures"], row["path"], row["peer"]) == (2, 1, "direct", "peerA")
    assert row["rtt_ms"] == pytest.approx(100.0)  # the faster call's estimate
    assert row["bytes_out_per_call"] == 100 and row["server_ms_per_call"] == pytest.approx(200.0)
    assert row["network_ms_per_call"] == pytest.approx((400 + 800) / 2)
    assert list(stats.snapshot("expert")) == ["expert.0.1"]  # another grid's expert is not ours
    assert stats.snapshot("other")["other.0"][0]["rtt_ms"] == pytest.approx(140.0)  # the connection's own
    assert set(stats.snapshot()) == {"expert.0.1", "other.0"}


def test_a_links_bytes_cost_compares_the_calls_transfer_with_their_round_trip():
    stats = CallStats()
    assert stats.bytes_cost("p") is None and stats.wire_seconds("p") is None  # nothing measured yet
    # 0.4 s on the network, 0.1 s of it the round trip: 200 kB (float16) took 0.3 s, 3 round trips
    stats.record("e.0", "p", report(compression=FLOAT16, bytes_out=100_000, bytes_in=100_000))
    assert stats.bytes_cost("p") == pytest.approx(3.0)
    assert stats.wire_seconds("p") == pytest.approx(0.3)
    # the same call in 8-bit moves about half the bytes in the same time: as float16 they would cost twice
    slow = CallStats()
    slow.record("e.0", "p", report(compression=BLOCKWISE8_64, bytes_out=100_000, bytes_in=100_000))
    assert slow.bytes_cost("p") == pytest.approx(3.0 * 2 / 1.0625)
    # a call whose bytes arrived within its round trip says the link is fast: cost well below 1
    fast = CallStats()
    fast.record("e.0", "p", report(compression=FLOAT16, done=10.5, bytes_out=10_000, bytes_in=10_000), rtt=0.3)
    assert fast.bytes_cost("p") < 1
    # later calls move the figures smoothly, never by one call alone
    for _ in range(3):
        stats.record("e.1", "p", report(compression=FLOAT16, done=10.51, bytes_out=10_000, bytes_in=10_000))
    assert 0 < stats.bytes_cost("p") < 3.0


def test_calls_too_small_to_measure_a_rate_leave_the_link_figures_alone():
    # 200 payload bytes that took 0.3 s beyond the round trip: a busy machine, not a slow link
    stats = CallStats()
    for _ in range(5):
        stats.record("e.0", "p", report(compression=FLOAT16, bytes_out=100, bytes_in=100))
    assert stats.bytes_cost("p") is None and stats.wire_seconds("p") is None
    assert choose_compression(AUTO, stats.bytes_cost("p"), stats.wire_seconds("p")) == FLOAT16
    assert stats.snapshot()["e.0"][0]["calls"] == 5  # still counted
    stats.record("e.0", "p", report(compression=FLOAT16, bytes_out=MIN_RATE_SAMPLE_BYTES, bytes_in=0))
    assert stats.bytes_cost("p") is not None


def test_auto_picks_half_by_default_and_8_bit_where_bytes_outweigh_the_round_trip():
    assert choose_compression(AUTO, None) == FLOAT16
    assert choose_compression(AUTO, 0.5, 0.1) == FLOAT16
    assert choose_compression(AUTO, 2.5, 0.1) == BLOCKWISE8_64
    assert choose_compression(AUTO, float("nan"), 0.1) == FLOAT16
    assert choose_compression(AUTO, 2.5, None) == FLOAT16  # no wire time measured: nothing to save


def test_auto_keeps_half_where_8_bit_would_save_only_microseconds():
    # loopback: a 0.1 ms round trip, the payload's 1 ms on the wire is ten round trips, yet
    # halving it saves 0.5 ms: not worth the rounding
    assert choose_compression(AUTO, 10.0, 0.001) == FLOAT16
    assert choose_compression(AUTO, 10.0, 4 * MIN_WIRE_SAVING_S) == BLOCKWISE8_64
    stats = CallStats()
    stats.record("e.0", "p", report(compression=FLOAT16, sent=10.001, first_reply=10.002, done=10.0021,
                                           server_s=0.0, bytes_out=10_000, bytes_in=10_000), rtt=0.0001)
    assert stats.bytes_cost("p") > 1
    assert choose_compression(AUTO, stats.bytes_cost("p"), stats.wire_seconds("p")) == FLOAT16
    for fixed in (NONE, FLOAT16, BLOCKWISE8_64):
        assert choose_compression(fixed, 9.0) == fixed  # a user's explicit choice stands


@pytest.mark.parametrize("values, used", [
    (torch.randn(64, 8), FLOAT16),
    (torch.randn(64, 8) * 1e5, NONE),  # beyond half's range: raw, never inf
    (torch.randn(64, 8) * 1e-7, BLOCKWISE8_64),  # tiny gradients: a scale that follows them
    (torch.zeros(4, 8), BLOCKWISE8_64),
    (torch.tensor([float("nan"), 1.0]), FLOAT16),  # NaN stays NaN, for the server's check
    (torch.randn(3, 8, dtype=torch.float64), FLOAT16),
    (torch.arange(6), NONE),  # integers always go raw
])
def test_float16_keeps_out_what_half_cannot_hold(values, used):
    header, payload = encode([values], FLOAT16)
    assert header["t"][0]["c"] == used
    [back] = deserialize(header, payload)
    assert back.dtype == values.dtype and back.shape == values.shape
    if values.is_floating_point() and torch.isfinite(values).all():
        scale = float(values.abs().max()) or 1.0
        assert float((back - values).abs().max()) <= scale * 2 ** -7


def test_auto_sends_tensors_as_they_are_on_a_fast_link():
    # loopback or a wired LAN: float16's conversions cost more than the bytes they save
    assert choose_compression(AUTO, None, None, rtt=0.0002) == NONE
    assert choose_compression(AUTO, 10.0, 4 * MIN_WIRE_SAVING_S, rtt=0.0002) == NONE
    assert choose_compression(AUTO, 0.5, MIN_HALF_SAVING_S / 2) == NONE  # halving saves microseconds
    # a home link: a round trip of tens of milliseconds keeps float16, or 8-bit where bytes weigh
    assert choose_compression(AUTO, None, None, rtt=0.030) == FLOAT16
    assert choose_compression(AUTO, 2.5, 0.1, rtt=0.030) == BLOCKWISE8_64
    stats = CallStats()
    stats.record("e.0", "p", report(compression=FLOAT16, bytes_out=100, bytes_in=100), rtt=0.0003)
    assert stats.rtt("p") == 0.0003
    assert choose_compression(AUTO, stats.bytes_cost("p"), stats.wire_seconds("p"), stats.rtt("p")) == NONE


def test_auto_never_goes_lossy_to_this_machine_or_its_lan():
    from volunteer.experts.callstats import is_local_address

    for ip in ("127.0.0.1", "127.0.0.3", "10.1.2.3", "172.20.0.5", "192.168.1.20", "169.254.3.4", "::1", "fd00::5",
               "fe80::1%eth0"):
        assert is_local_address(ip), ip
        # a loaded machine's measurements would say float16 or 8-bit; the path says none
        assert choose_compression(AUTO, 2.5, 0.1, 0.05, local=True) == NONE
    for ip in ("203.0.113.7", "198.51.100.2", "192.0.2.9", "100.64.0.1", "8.8.8.8", "2001:db8::1", "junk"):
        assert not is_local_address(ip), ip
    assert choose_compression("float16", None, local=True) == "float16"  # a setting is a setting


def test_the_path_a_call_takes_decides_whether_it_is_local():
    from volunteer.experts.callstats import is_local_path
    from volunteer.net.identity import KeyPair
    from volunteer.net.multiaddr import Multiaddr

    relay, target = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    local = [
        "/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.20/udp/4001/quic-v1", "/ip6/fd00::5/tcp/1", "/memory/7",
        "/dns4/localhost/tcp/4001", "/dns/nas.local/tcp/4001",
        # a circuit through a relay on this machine or its LAN: every byte we send stays here
        f"/ip4/127.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}",
        f"/ip4/10.0.0.2/tcp/4001/p2p/{relay}/p2p-circuit",
    ]
    wan = [
        "/ip4/203.0.113.7/tcp/4001", "/ip6/2001:db8::1/tcp/4001", "/dns4/example.com/tcp/4001", "/dns4/localhost.example.com/tcp/1",
        # a LAN peer reached through a relay on the internet: the bytes cross the internet twice
        f"/ip4/198.51.100.2/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}",
        f"/p2p/{relay}/p2p-circuit/p2p/{target}",
    ]
    for addr in local:
        assert is_local_path(Multiaddr(addr)), addr
    for addr in wan:
        assert not is_local_path(Multiaddr(addr)), addr


class _Conn:
    def __init__(self, remote_addr) -> None:
        self.remote_addr = remote_addr


class _Host:
    """What a trainer's ``_Call`` asks of its host to choose an encoding: its connection to the
    expert's host and the addresses its peerstore knows."""

    def __init__(self, conn=None, addrs=()) -> None:
        from volunteer.net.peerstore import Peerstore

        self.conn = conn
        self.peerstore = Peerstore()
        self.addrs = list(addrs)

    def connection_to(self, peer):
        return self.conn


def test_auto_is_exact_on_the_path_a_call_takes_whatever_the_figures_say():
    from types import SimpleNamespace

    from volunteer.experts.client import _Call
    from volunteer.net.identity import KeyPair
    from volunteer.net.multiaddr import Multiaddr

    relay, target = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    stats = CallStats()  # a loaded machine: 50 ms round trips, bytes that outweigh them
    stats.record("e.0", str(target), report(bytes_out=10**6, bytes_in=10**6, done=12.0), rtt=0.05)

    def encoding(conn_addr=None, known=(), peer=target) -> str:
        host = _Host(_Conn(Multiaddr(conn_addr)) if conn_addr else None)
        if known:
            host.peerstore.add_addrs(target, [Multiaddr(a) for a in known])
        call = _Call(SimpleNamespace(host=host), "e.0", peer, 5.0, 5.0, AUTO, stats=stats)
        return call._encoding()

    assert encoding("/ip4/203.0.113.7/tcp/4001") == BLOCKWISE8_64  # the figures speak on the internet
    assert encoding("/ip4/127.0.0.1/tcp/4001") == NONE
    assert encoding("/ip4/192.168.1.5/udp/4001/quic-v1") == NONE
    assert encoding(f"/ip4/10.0.0.2/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}") == NONE  # a LAN relay
    assert encoding(f"/ip4/198.51.100.2/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{target}") == BLOCKWISE8_64
    # not connected yet: where it will dial
    assert encoding(known=["/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.5/tcp/4001"]) == NONE
    assert encoding(known=["/ip4/192.168.1.5/tcp/4001", "/ip4/203.0.113.7/tcp/4001"]) == BLOCKWISE8_64
    assert encoding(peer=Multiaddr(f"/ip4/127.0.0.1/tcp/4001/p2p/{target}")) == NONE
