"""No punch waits for evidence that cannot come: with no QUIC connection up or coming (an
office that drops UDP), a missing QUIC observation is no reason to hold a hole punch back."""

from __future__ import annotations

import trio

from volunteer.net.nat.dcutr import HolePuncher
from volunteer.net.nat.observer import AddressObserver
from volunteer.net.stack import StackOptions, open_stack

BOTH = ["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"]
OPTIONS = StackOptions(perf=None, port_mapping=False)


async def test_no_observation_wait_for_a_transport_nothing_can_be_observed_on():
    with trio.fail_after(30):
        async with open_stack(listen=BOTH, options=OPTIONS) as a, \
                open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=OPTIONS) as b:
            await a.connect(b.full_addrs()[0])  # over TCP: b has no QUIC address to observe us from
            while not (a.peerstore.get(b.peer_id) and a.peerstore.get(b.peer_id).protocols):
                await trio.sleep(0.01)
            observer = a.service(AddressObserver)
            puncher = a.service(HolePuncher)
            assert observer is not None and puncher is not None
            assert not observer.awaiting("quic", trio.current_time())
            assert not puncher.observation_pending()
