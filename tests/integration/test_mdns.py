"""mDNS LAN discovery (libp2p's `_p2p._udp.local`): two DHT nodes that know nothing of each other
find each other on the (loopback) LAN and join each other's routing table; TXT parsing is strict."""

from __future__ import annotations

import trio

from volunteer.dht import DHTConfig
from volunteer.dht.mdns import MdnsDiscovery, encode_txt, parse_txt
from volunteer.dht.node import open_dht
from volunteer.net.host import HostConfig, open_host
from volunteer.net.identity import PeerID
from volunteer.net.multiaddr import Multiaddr

QUIET = HostConfig(enable_hole_punching=False, enable_relay_client=False, enable_perf=False)


def test_txt_round_trip_and_malformed_input():
    addrs = ["/ip4/192.0.2.1/tcp/4001/p2p/12D3KooWA", "/ip4/198.51.100.2/tcp/4001/p2p/12D3KooWA"]
    assert parse_txt(encode_txt(addrs)) == addrs
    assert parse_txt(None) == [] and parse_txt(b"") == []
    garbage = b"\x05hello" + b"\x09dnsaddr=x" + b"\x20dnsaddr=/ip4/1" + b"\x03\xff\xfe\xfd" + b"\x0fdnsaddr=/ip4/1.2"
    assert parse_txt(garbage) == []  # wrong prefix, not a multiaddr, truncated, not UTF-8
    assert parse_txt(b"\x0adnsaddr=/x" + b"\x0bdnsaddr=\xff\xff") == ["/x"]
    assert encode_txt(["/" + "a" * 300]) == b""  # too long for one TXT string: left out


async def test_two_nodes_on_a_lan_find_each_other():
    async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], config=QUIET) as h1, open_host(
        listen=["/ip4/127.0.0.1/tcp/0"], config=QUIET
    ) as h2:
        config = DHTConfig(swarm_id="lan")
        async with open_dht(h1, config) as d1, open_dht(h2, config) as d2, trio.open_nursery() as nursery:
            for host, dht in ((h1, d1), (h2, d2)):
                def found(peer: str, addrs: list[str], dht=dht) -> None:
                    nursery.start_soon(dht.add_peer, PeerID.from_string(peer), [Multiaddr(a) for a in addrs])

                discovery = MdnsDiscovery(str(host.peer_id), lambda host=host: [str(a) for a in host.full_addrs()], found,
                                          interfaces=["127.0.0.1"])
                await nursery.start(discovery.run)
            with trio.fail_after(15):
                while h2.peer_id not in d1.state.table or h1.peer_id not in d2.state.table:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
