"""A DHT peer's loopback addresses never enter our table or reach a third peer (``dht.scope``)."""

from volunteer.dht.config import DHTConfig
from volunteer.dht.messages import KeyResult, Nodes, Ping, Stored, Values, encode_request, unframe
from volunteer.dht.routing import Contact
from volunteer.dht.scope import own_contact_addrs, scoped_response, usable_addrs
from volunteer.dht.state import NodeState
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr as M

LOOP = M("/ip4/127.0.0.1/udp/4001/quic-v1").to_bytes()
LINK = M("/ip6/fe80::1/tcp/4001").to_bytes()
LAN = M("/ip4/192.168.1.5/tcp/4001").to_bytes()
PUB = M("/ip4/198.51.100.7/tcp/4001").to_bytes()
FROM_AFAR = M("/ip4/203.0.113.9/tcp/6000")
FROM_HERE = M("/ip4/127.0.0.1/tcp/6000")


def test_usable_addrs_drop_loopback_from_afar_and_garbage():
    assert usable_addrs([LOOP, LINK, LAN, PUB, b"\xff\xff"], FROM_AFAR) == (LAN, PUB)
    assert usable_addrs([LOOP, LINK, LAN, PUB], FROM_HERE) == (LOOP, LAN, PUB)


def test_reply_contacts_keep_only_usable_addresses():
    peer = KeyPair.generate().peer_id
    contact = Contact(peer, (LOOP, PUB))
    assert scoped_response(Nodes((contact,)), FROM_AFAR).peers[0].addrs == (PUB,)
    assert scoped_response(Stored(("ok",), closer=(contact,)), FROM_AFAR).closer[0].addrs == (PUB,)
    values = scoped_response(Values((KeyResult((), (contact,)),)), FROM_AFAR)
    assert values.results[0].closer[0].addrs == (PUB,)
    assert scoped_response(Nodes((contact,)), FROM_HERE).peers[0].addrs == (LOOP, PUB)


def test_a_request_from_afar_does_not_put_its_loopback_in_our_table():
    config = DHTConfig()
    state = NodeState(KeyPair.generate().peer_id, config)
    sender = KeyPair.generate().peer_id
    body = unframe(encode_request(Ping(False, (LOOP, LINK, PUB)), config), config)
    state.handle(sender, body, 100.0, via=FROM_AFAR)
    assert state.table.get(sender).contact.addrs == (PUB,)
    other = KeyPair.generate().peer_id
    state.handle(other, body, 100.0, via=FROM_HERE)
    assert state.table.get(other).contact.addrs == (LOOP, PUB)


def test_own_contact_puts_loopback_last_under_the_cap():
    addrs = [M("/ip4/127.0.0.1/tcp/1"), M("/ip4/192.168.1.5/tcp/1"), M("/ip4/198.51.100.7/tcp/1")]
    assert own_contact_addrs(addrs, 2) == (M("/ip4/192.168.1.5/tcp/1").to_bytes(), M("/ip4/198.51.100.7/tcp/1").to_bytes())
