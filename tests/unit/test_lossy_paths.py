"""Which QUIC addresses a lossy TCP connection moves to (net/lossy_paths.py): the peer's QUIC
addresses on the host the TCP connection reaches, then its QUIC ports on that host, then its
other addresses; never its loopback ones unless the TCP connection is on loopback itself. And
which loss makes a path worse than another (transport/pathloss.py)."""

from __future__ import annotations

from types import SimpleNamespace

from volunteer.net import limits
from volunteer.net.lossy_paths import MAX_QUIC_ADDRS, quic_candidates
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.transport.pathloss import LossWindow, PathLoss


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


def test_the_loss_window_forgets_what_a_young_connection_lost():
    span, packet = limits.REPAIRED_PATH_WINDOW, 1200
    window = LossWindow(span)
    for index in range(-(-limits.REPAIRED_PATH_MIN_BYTES // packet)):
        window.on_sent(packet)
        if index % 10 == 0:
            window.on_lost(packet)
    assert window.recent() == PathLoss(sent=window.sent, lost=window.lost)  # all of it, so far
    for _ in range((span + window.step) // packet + 1):
        window.on_sent(packet)
    recent = window.recent()
    assert span <= recent.sent <= span + window.step and recent.lost == 0
    assert window.lost / window.sent > limits.QUIC_LOSS_TOLERANCE  # the whole count still says 3 %


def test_a_repaired_path_hurts_when_its_losses_are_a_full_queue():
    """A repaired path goes back after TCP when 2 % or more of what it sent is lost unrepaired,
    still lately in congestion avoidance (1 %), and either 5 % or more is (no line loses that
    much at random) or repairs rebuild next to nothing (the line itself barely loses: the losses
    are a queue overflowing, which TCP handles at least as well)."""
    judged = limits.REPAIRED_PATH_MIN_BYTES
    steady_bytes = limits.LOSSY_PATH_MIN_BYTES

    def path(whole: float, steady: float | None, rebuilt: float = 0.0, steady_sent: int = steady_bytes) -> PathLoss:
        lately = None if steady is None else PathLoss(sent=steady_sent, lost=int(steady_sent * steady))
        return PathLoss(sent=judged, lost=int(judged * whole), repaired=True, steady=lately,
                        rebuilt=int(judged * rebuilt))

    # a cable modem's queue: losses in runs, repairs rebuild almost nothing
    assert path(0.03, 0.02, rebuilt=0.001).hurts()
    assert path(0.03, None).hurts()  # nothing known of its steady state: the whole count decides
    # a long line losing 1 % at random next to flows that fill its queue: repairs earn their keep
    assert not path(0.03, 0.02, rebuilt=0.01).hurts()
    assert path(0.06, 0.05, rebuilt=0.01).hurts()  # ... unless it loses more than any line does at random
    # an overshoot once, then 0.5 %
    assert not path(0.03, 0.005).hurts()
    assert not path(0.03, 0.02, steady_sent=steady_bytes - 1).hurts()  # too little steady state to judge
    assert not path(0.015, 0.02).hurts()  # under 2 % in all
