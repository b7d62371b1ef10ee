"""DCUtR offers LAN addresses to a peer behind our own router (``same_lan``): the two share the
public address peers observe, and a router without hairpinning refuses it from inside."""

from volunteer.net.multiaddr import Multiaddr as M
from volunteer.net.nat.dcutr import same_lan


def test_a_peer_that_shares_our_observed_public_ip_is_on_our_lan():
    ours = [M("/ip4/198.51.100.7/tcp/4001"), M("/ip4/198.51.100.7/udp/4002/quic-v1")]
    assert same_lan(ours, [M("/ip4/198.51.100.7/tcp/5123")])
    assert not same_lan(ours, [M("/ip4/203.0.113.9/tcp/4001")])
    # private addresses say nothing: every home has a 192.168.1.x
    assert not same_lan([M("/ip4/192.168.1.2/tcp/1")], [M("/ip4/192.168.1.2/tcp/1")])
    assert not same_lan([], [M("/ip4/198.51.100.7/tcp/5123")])
