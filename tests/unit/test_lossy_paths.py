"""Which QUIC addresses a lossy TCP connection moves to (net/lossy_paths.py): the peer's QUIC
addresses on the host the TCP connection reaches, then its QUIC ports on that host, then its
other addresses; never its loopback ones unless the TCP connection is on loopback itself. And
which loss makes a path worse than another (transport/pathloss.py)."""

from __future__ import annotations

from types import SimpleNamespace

from volunteer.net import limits
from volunteer.net.lossy_paths import MAX_QUIC_ADDRS, quic_candidates
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.transport.pathloss import PathLoss


def over(addr: str) -> SimpleNamespace:
    return SimpleNamespace(remote_addr=Multiaddr(addr))


def addrs(*texts: str) -> list[Multiaddr]:
    return [Multiaddr(t) for t in texts]


def test_the_peers_quic_port_on_the_host_tcp_reaches_comes_first():
    found = quic_candidates(addrs("/ip4/127.0.0.1/udp/4001/quic-v1", "/ip4/192.0.2.7/udp/4001/quic-v1",
                                  "/ip4/192.0.2.7/tcp/4001"), over("/ip4/203.0.113.9/tcp/4001"))
    assert [str(a) for a in found] == ["/ip4/203.0.113.9/udp/4001/quic-v1", "/ip4/192.0.2.7/udp/4001/quic-v1"]


def test_an_advertised_address_on_that_host_is_tried_before_a_guess():
    found = quic_candidates(addrs("/ip4/203.0.113.9/udp/5000/quic-v1", "/ip4/10.0.0.2/udp/4001/quic-v1"),
                            over("/ip4/203.0.113.9/tcp/4001"))
    assert [str(a) for a in found][:2] == ["/ip4/203.0.113.9/udp/5000/quic-v1", "/ip4/203.0.113.9/udp/4001/quic-v1"]
    assert len(found) <= MAX_QUIC_ADDRS


def test_loopback_only_for_a_loopback_connection_and_nothing_without_quic():
    assert quic_candidates(addrs("/ip4/127.0.0.1/udp/4001/quic-v1"), over("/ip4/127.0.0.1/tcp/4001")) == \
        addrs("/ip4/127.0.0.1/udp/4001/quic-v1")
    assert quic_candidates(addrs("/ip4/192.0.2.7/tcp/4001"), over("/ip4/203.0.113.9/tcp/4001")) == []
    assert quic_candidates(addrs("/ip4/192.0.2.7/udp/1/quic-v1"), over("/memory/3")) == []


def test_which_loss_hurts_a_path():
    enough = limits.LOSSY_PATH_MIN_BYTES
    assert not PathLoss(sent=enough - 1, lost=enough // 10).hurts()  # too few bytes to judge
    assert not PathLoss(sent=enough, lost=0).hurts()
    assert PathLoss(sent=enough, lost=int(enough * 0.003)).hurts()  # TCP resending 0.3 %: a lossy line
    judged = limits.REPAIRED_PATH_MIN_BYTES
    assert not PathLoss(sent=judged, lost=int(judged * 0.01), repaired=True).hurts()  # repairs absorb 1 %
    # beyond what repairs absorb: a full queue, which TCP's congestion control handles at least as well
    assert PathLoss(sent=judged, lost=int(judged * 0.03), repaired=True).hurts()
    # the losses that turned the repairs on weigh too much in a short count: not judged yet
    assert not PathLoss(sent=enough, lost=int(enough * 0.03), repaired=True).hurts()
