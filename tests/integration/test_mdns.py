"""mDNS LAN discovery (libp2p's `_p2p._udp.local`): two DHT nodes that know nothing of each other
find each other on the (loopback) LAN and join each other's routing table; TXT parsing is strict."""

from __future__ import annotations

import pytest

import time

import trio
import zeroconf

from volunteer.dht import DHTConfig
from volunteer.dht.mdns import SERVICE, MdnsDiscovery, encode_txt, parse_txt
from volunteer.dht.node import open_dht
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.identity import PeerID
from volunteer.net.multiaddr import Multiaddr

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


def test_txt_round_trip_and_malformed_input():
    addrs = ["/ip4/192.0.2.1/tcp/4001/p2p/12D3KooWA", "/ip4/198.51.100.2/tcp/4001/p2p/12D3KooWA"]
    assert parse_txt(encode_txt(addrs)) == addrs
    assert parse_txt(None) == [] and parse_txt(b"") == []
    garbage = b"\x05hello" + b"\x09dnsaddr=x" + b"\x20dnsaddr=/ip4/1" + b"\x03\xff\xfe\xfd" + b"\x0fdnsaddr=/ip4/1.2"
    assert parse_txt(garbage) == []  # wrong prefix, not a multiaddr, truncated, not UTF-8
    assert parse_txt(b"\x0adnsaddr=/x" + b"\x0bdnsaddr=\xff\xff") == ["/x"]
    assert encode_txt(["/" + "a" * 300]) == b""  # too long for one TXT string: left out


@pytest.mark.slow
async def test_two_nodes_on_a_lan_find_each_other():
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as h1, open_stack(
        listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET
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


class _LateEventBrowser(zeroconf.ServiceBrowser):
    """A ServiceBrowser that gets one more announcement just as it is cancelled, and gives up
    waiting for its thread after a while instead of hanging the test."""

    stuck: bool | None = None

    def cancel(self) -> None:
        self.queue.put(((SERVICE, "latecomer." + SERVICE), zeroconf.ServiceStateChange.Added))
        time.sleep(0.05)  # the browser thread is now inside our handler
        super().cancel()

    def join(self, timeout=None) -> None:
        super().join(5)
        type(self).stuck = self.is_alive()


@pytest.mark.slow
async def test_cancel_while_an_announcement_arrives_does_not_deadlock(monkeypatch):
    # ServiceBrowser.cancel() joins the browser thread; a handler that waited there for the trio
    # thread (trio.from_thread.run_sync) would wait for ever
    monkeypatch.setattr(zeroconf, "ServiceBrowser", _LateEventBrowser)
    me = "12D3KooWlateLateLate"
    discovery = MdnsDiscovery(me, lambda: [f"/ip4/127.0.0.1/tcp/1/p2p/{me}"], lambda *_: None, interfaces=["127.0.0.1"])
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(discovery.run)
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    assert _LateEventBrowser.stuck is False


@pytest.mark.slow
async def test_a_peer_that_leaves_and_returns_is_reported_again():
    seen: list[str] = []
    them = "12D3KooWreturnsReturns"
    addrs = [f"/ip4/127.0.0.1/tcp/4001/p2p/{them}"]
    watcher = MdnsDiscovery("12D3KooWwatcher", lambda: ["/ip4/127.0.0.1/tcp/4002/p2p/12D3KooWwatcher"],
                            lambda peer, _: seen.append(peer), interfaces=["127.0.0.1"])
    with trio.fail_after(30):
        async with trio.open_nursery() as outer:
            await outer.start(watcher.run)
            for visit in (1, 2):
                async with trio.open_nursery() as inner:
                    await inner.start(MdnsDiscovery(them, lambda: addrs, lambda *_: None, interfaces=["127.0.0.1"]).run)
                    while seen.count(them) < visit:
                        await trio.sleep(0.05)
                    inner.cancel_scope.cancel()
                while them in watcher.found:  # its goodbye packets arrived
                    await trio.sleep(0.05)
            outer.cancel_scope.cancel()
    # other mDNS peers on this machine (another test run) may be reported too
    assert [peer for peer in seen if peer == them] == [them, them]
