"""Nothing unroutable leaves a node: a peer that reached us over a LAN or public address hears
none of our loopback addresses (identify, DHT contacts), and keeps none of another's; two
nodes on one loopback still tell each other theirs (a loopback-only testnet keeps working)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import ifaddr
import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.node import open_dht
from volunteer.net.addresses import is_loopback
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.stack import StackOptions, open_stack

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
CONFIG = DHTConfig(swarm_id="scope")
LAN_IPS = [str(ip.ip) for adapter in ifaddr.get_adapters() for ip in adapter.ips
           if ip.is_IPv4 and not str(ip.ip).startswith(("127.", "169.254."))]
needs_lan = pytest.mark.skipif(not LAN_IPS, reason="this machine has no non-loopback IPv4 interface")


def _lan_addr(host) -> Multiaddr:
    return next(a for a in host.full_addrs() if a.value_at(0) == LAN_IPS[0] and "tcp" in a.protocols())


async def _identified(host, peer) -> list[Multiaddr]:
    with trio.fail_after(10):
        while not host.peerstore.get(peer) or not host.peerstore.get(peer).protocols:
            await trio.sleep(0.01)
    return host.peerstore.addrs(peer)


@needs_lan
async def test_identify_over_a_lan_address_carries_no_loopback():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/0.0.0.0/tcp/0"], options=QUIET) as a, \
                open_stack(listen=["/ip4/0.0.0.0/tcp/0"], options=QUIET) as b:
            assert any(is_loopback(x) for x in a.addrs)  # a listens on loopback too
            await b.connect(_lan_addr(a))
            told = await _identified(b, a.peer_id)
            assert told and not any(is_loopback(x) for x in told)
            told_back = await _identified(a, b.peer_id)
            assert told_back and not any(is_loopback(x) for x in told_back)


async def test_identify_over_loopback_keeps_loopback():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as a, \
                open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as b:
            await b.connect(a.full_addrs()[0])
            told = await _identified(b, a.peer_id)
            assert told and all(is_loopback(x) for x in told)


@needs_lan
async def test_dht_contacts_from_afar_hold_no_loopback():
    """A joins through B over the LAN: neither's table holds the other's loopback, and a third
    node that asks B for A learns no loopback address of A's either."""
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            hosts = [await stack.enter_async_context(open_stack(listen=["/ip4/0.0.0.0/tcp/0"], options=QUIET))
                     for _ in range(3)]
            boot = await stack.enter_async_context(open_dht(hosts[0], CONFIG))
            a = await stack.enter_async_context(open_dht(hosts[1], CONFIG, bootstrap=[_lan_addr(hosts[0])]))
            c = await stack.enter_async_context(open_dht(hosts[2], CONFIG, bootstrap=[_lan_addr(hosts[0])]))
            entry = boot.state.table.get(hosts[1].peer_id)
            assert entry is not None and entry.contact.addrs
            assert not any(is_loopback(Multiaddr(raw)) for raw in entry.contact.addrs)
            back = a.state.table.get(hosts[0].peer_id)
            assert back is not None and not any(is_loopback(Multiaddr(raw)) for raw in back.contact.addrs)
            found = await c.find_closest(a.state.table.local_id)
            learned = [x for x in found if x.peer == hosts[1].peer_id]
            assert learned and learned[0].addrs
            assert not any(is_loopback(Multiaddr(raw)) for raw in learned[0].addrs)
            assert not any(is_loopback(x) for x in hosts[2].peerstore.addrs(hosts[1].peer_id))
