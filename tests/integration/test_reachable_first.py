"""Reachable first: a joining volunteer's relay reservation starts beside its DHT bootstrap, not
after it. A bootstrap peer that never answers DHT requests holds the bootstrap for a minute;
the reservation must be in place meanwhile (it was one bootstrap later before)."""

from __future__ import annotations

import trio

from relay.node import open_relay_node
from volunteer.dht import DHTConfig
from volunteer.net.identity import KeyPair
from volunteer.net.stack import StackOptions, open_stack
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

SWARM = "reachfirst"
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
SLOW = DHTConfig(swarm_id=SWARM, request_timeout=120.0)


async def test_relay_reservation_does_not_wait_for_the_dht_bootstrap():
    with trio.fail_after(30):
        async with open_relay_node(KeyPair.generate(), [LOOPBACK], swarms=[SWARM]) as relay, \
                open_stack(listen=[LOOPBACK], options=StackOptions(perf=None, relay_client=False, hole_punching=False)) as mute:

            async def never_answer(stream) -> None:
                await trio.sleep_forever()

            mute.set_handler(SLOW.protocol_id, never_answer)
            relay_addr = relay.host.full_addrs()[0]
            spec = SwarmSpec(SWARM, SWARM, [relay_addr, mute.full_addrs()[0]], [relay_addr])
            keypair = KeyPair.generate()
            # no AutoNAT servers: on loopback they would call us public, and public needs no relay
            options = VolunteerOptions(listen=[LOOPBACK], keypair=keypair, mdns=False, dht_config=SLOW, nat_servers=[],
                                       stack=StackOptions(perf=None))
            joined = trio.Event()

            async def join() -> None:
                async with open_volunteer(spec, options):
                    joined.set()
                    await trio.sleep_forever()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(join)
                while not relay.hop.resources.has_reservation(keypair.peer_id, trio.current_time()):
                    await trio.sleep(0.05)
                assert not joined.is_set()  # the DHT's bootstrap still waits on the mute peer
                nursery.cancel_scope.cancel()
