"""The local demo: a small swarm on loopback, shown step by step.

A public relay, a volunteer that keeps a reservation on it (as one behind NAT would), and a
trainer that reaches the volunteer through the relay, watches hole punching move the connection
to a direct one, and measures it. (Experts and the DHT join the demo as they land.)
"""

from __future__ import annotations

import sys

import trio

from relay.node import open_relay_node
from volunteer.errors import ConnectionLost
from volunteer.net.stack import open_stack
from volunteer.net.identify import identify_of
from volunteer.net.identity import KeyPair
from volunteer.net.nat.relay_client import ReservationManager
from volunteer.net.perf import PERF, perf_stream
from volunteer.net.ping import PING, Pinger

LOCALHOST = "/ip4/127.0.0.1/tcp/0"


def _best_connection(trainer, peer):
    """The trainer's best open connection to ``peer``; the demo cannot go on without one."""
    best = trainer.connection_to(peer)
    if best is None:
        raise ConnectionLost(f"the trainer lost every connection to {peer}")
    return best


async def run_demo(size: int = 32 * 1024 * 1024) -> None:
    async with open_relay_node(KeyPair.generate(), [LOCALHOST]) as relay, open_stack(listen=[LOCALHOST]) as volunteer, open_stack(
        listen=[LOCALHOST]
    ) as trainer, trio.open_nursery() as nursery:
        relay_addr = relay.host.full_addrs()[0]
        print(f"relay      {relay_addr}")
        reservations = ReservationManager([relay_addr], want=1)
        await volunteer.add_service(reservations)
        while not reservations.reservations:
            await trio.sleep(0.01)
        circuit = reservations.circuit_addrs()[0].encapsulate(f"/p2p/{volunteer.peer_id}")
        print(f"volunteer  reserved a slot: reachable at {circuit}")

        started = trio.current_time()
        conn = await trainer.connect(circuit)
        print(f"trainer    connected in {(trio.current_time() - started) * 1000:.1f} ms, path: {conn.describe_path()}")
        await identify_of(trainer).ask(relay.host.peer_id)
        pinger: Pinger | None = None
        pinger_conn = None
        for seq in range(1, 7):
            best = _best_connection(trainer, volunteer.peer_id)
            if pinger is None or best is not pinger_conn:
                pinger, pinger_conn = Pinger(await best.new_stream([PING])), best
            rtt = await pinger.ping()
            print(f"trainer    ping seq={seq} rtt={rtt * 1000:.2f} ms path={best.describe_path()}")
            await trio.sleep(0.2)
        best = _best_connection(trainer, volunteer.peer_id)
        up, down = await perf_stream(await best.new_stream([PERF]), size, size)
        print(f"trainer    perf over {best.describe_path()}: {size / up / 1e6:.0f} MB/s up, {size / down / 1e6:.0f} MB/s down")
        print(f"relay      carried {relay.hop.resources.bytes_relayed} bytes (the rest went direct)")
        nursery.cancel_scope.cancel()
    print("demo done")


def main() -> int:
    trio.run(run_demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
