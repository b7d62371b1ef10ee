"""DCUtR offers LAN addresses to a peer behind our own router (``same_lan``): the two share the
public address peers observe, and a router without hairpinning refuses it from inside."""

from volunteer.net.multiaddr import Multiaddr as M
from volunteer.net.nat.dcutr import same_lan


def test_a_peer_that_shares_our_observed_public_ip_is_on_our_lan():
    ours = [M("/ip4/198.51.100.7/tcp/4001"), M("/ip4/198.51.100.7/udp/4002/quic-v1")]
    assert same_lan(ours, [M("/ip4/198.51.100.7/tcp/5123")])
    assert not same_lan(ours, [M("/ip4/203.0.113.9/tcp/4001")])
    # loopback says nothing, nor a relayed address (its IP is the relay's)
    assert not same_lan([M("/ip4/127.0.0.1/tcp/1")], [M("/ip4/127.0.0.1/tcp/1")])
    relayed = M("/ip4/198.51.100.7/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit")
    assert not same_lan(ours, [relayed])
    assert not same_lan([], [M("/ip4/198.51.100.7/tcp/5123")])
