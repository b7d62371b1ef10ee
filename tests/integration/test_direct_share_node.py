"""The NAT manager counts the share of peer sessions and bytes that went direct from the Host's
connection events (what ``volunteer status --json`` and the metrics show)."""

from __future__ import annotations

import trio

from volunteer.net.nat.manager import NatManager
from volunteer.net.stack import StackOptions, open_stack

from ..echo import echo, roundtrip

ECHO = "/test/echo/1.0.0"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False, port_mapping=False)


async def test_a_direct_peer_session_and_its_bytes_count_as_direct():
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as a, \
                open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as b:
            manager = NatManager(a, servers=[])
            await a.add_service(manager)
            b.set_handler(ECHO, echo)
            stream = await a.new_stream(b.full_addrs()[0], [ECHO])
            assert await roundtrip(stream, b"x" * 10_000) == b"x" * 10_000
            view = manager.snapshot()["direct"]
            assert view["direct_connection_share"] == 1.0 and view["direct_data_share"] == 1.0
            assert view["bytes_direct"] >= 20_000 and view["bytes_relayed"] == 0
            await stream.aclose()
            for conn in a.connections(b.peer_id):
                await conn.aclose()
            while manager.direct_share.sessions == 0:
                await trio.sleep(0.01)
            assert manager.direct_view()["peer_sessions"] == 1 and manager.direct_share.ended_direct == 1
