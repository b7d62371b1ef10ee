"""Two Hosts in one process, run inside a namespace whose loopback drops a share of the TCP
packets to the first Host's port (tests/nat/test_lossy_paths.py sets that up). The second Host
calls the first over TCP; once TCP shows the loss, LossyPathRepair opens QUIC beside it and
later calls go there. Prints one JSON line with what happened.

    python lossy_path_node.py TCP_PORT UDP_PORT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio  # noqa: E402

from volunteer.net.lossy_paths import LossyPathRepair  # noqa: E402
from volunteer.net.pool import pool_of  # noqa: E402
from volunteer.net.stack import StackOptions, open_stack  # noqa: E402
from tests.echo import echo  # noqa: E402

ECHO = "/test/echo/1.0.0"
CALLS = 40
PAYLOAD = 64 * 1024


async def main(tcp_port: int, udp_port: int) -> None:
    options = StackOptions(port_mapping=False, hole_punching=False, relay_client=False, lossy_path_repair=False)
    listen = [f"/ip4/127.0.0.1/tcp/{tcp_port}", f"/ip4/127.0.0.1/udp/{udp_port}/quic-v1"]
    with trio.fail_after(60):
        async with open_stack(listen=listen, options=options) as a, open_stack(
                listen=["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"], options=options,
                services=[LossyPathRepair(interval=0.2)]) as b:
            a.set_handler(ECHO, echo)
            # TCP first, alone: with QUIC known too, a dropped SYN (3 % of them) lets the dialer's
            # QUIC attempt win and there would be no TCP path to move off
            tcp_addrs = [addr for addr in a.listen_addrs if "tcp" in addr.protocols()]
            b.peerstore.add_addrs(a.peer_id, tcp_addrs)
            assert (await b.connect(a.peer_id)).transport == "tcp"
            b.peerstore.add_addrs(a.peer_id, a.listen_addrs)
            paths = []
            for _ in range(CALLS):
                payload = os.urandom(PAYLOAD)
                async with pool_of(b).stream(a.peer_id, ECHO) as lease:
                    await lease.stream.send_all(payload)  # echoed back as it comes
                    assert await lease.stream.receive_exactly(len(payload)) == payload
                    paths.append(lease.stream.connection.transport)
                await trio.sleep(0.05)
            service = b.service(LossyPathRepair)
            tcp = [c for c in b.connections(a.peer_id) if c.transport == "tcp"]
            quic = [c for c in b.connections(a.peer_id) if c.transport == "quic"]
            print(json.dumps({
                "paths": paths,
                "moved": service.moved,
                "tcp_loss": tcp[0].raw.loss().share if tcp else None,
                "tcp_loses": tcp[0].loses_packets() if tcp else None,
                "quic_repaired": quic[0].raw.loss().repaired if quic else None,
                "best": b.connection_to(a.peer_id).transport,
            }), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), int(sys.argv[2]))
