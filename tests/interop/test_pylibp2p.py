"""Interop with py-libp2p 0.8.1, both directions: Noise + yamux, ping, identify, echo, perf."""

from __future__ import annotations

import os
from functools import partial

import pytest
import trio

from volunteer.net.stack import open_stack
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.perf import PERF, PerfServer, perf_stream
from volunteer.net.identify import identify_of
from volunteer.net.ping import ping_of

from .conftest import run_pylibp2p

pytestmark = pytest.mark.interop
ECHO = "/echo/1.0.0"


async def echo(stream) -> None:
    while data := await stream.receive_some(1 << 20):
        await stream.send_all(data)
    await stream.send_eof()


async def test_we_dial_pylibp2p(pylibp2p_server):
    with trio.fail_after(60):
        async with open_stack() as host:
            conn = await host.connect(pylibp2p_server)
            assert str(conn.remote_peer) == Multiaddr(pylibp2p_server).peer_id.to_base58()
            pinger = await ping_of(host).open(conn.remote_peer)
            assert 0 < await pinger.ping() < 5
            await pinger.aclose()
            info = await identify_of(host).ask(conn.remote_peer)
            assert info.peer_id == conn.remote_peer
            assert "/ipfs/ping/1.0.0" in info.protocols and ECHO in info.protocols
            # Echo over py-libp2p's yamux: byte-exact, larger than one yamux window.
            payload = os.urandom(700_000)
            stream = await host.new_stream(conn.remote_peer, [ECHO])
            received = bytearray()
            async with trio.open_nursery() as nursery:
                async def send():
                    await stream.send_all(payload)
                    await stream.send_eof()

                nursery.start_soon(send)
                while len(received) < len(payload):
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        break
                    received += data
            assert bytes(received) == payload
            await stream.aclose()


async def test_our_perf_client_against_pylibp2p_perf_service(pylibp2p_server):
    with trio.fail_after(60):
        async with open_stack() as host:
            stream = await host.new_stream(pylibp2p_server, [PERF])
            uploaded, downloaded = [], []
            await perf_stream(stream, 1_000_003, 2_000_005, uploaded.append, downloaded.append)
            assert sum(uploaded) == 1_000_003 and sum(downloaded) == 2_000_005


async def test_pylibp2p_dials_us(pylibp2p_python):
    with trio.fail_after(120):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as host:
            host.set_handler(ECHO, echo)
            addr = str(host.full_addrs()[0])
            report = await trio.to_thread.run_sync(partial(run_pylibp2p, pylibp2p_python, "dial-echo", addr, "--size", "500000"))
            assert report["ok"] and report["bytes"] == 500_000, report
            report = await trio.to_thread.run_sync(partial(run_pylibp2p, pylibp2p_python, "dial-ping", addr, "--count", "3"))
            assert report["ok"], report
            report = await trio.to_thread.run_sync(partial(run_pylibp2p, pylibp2p_python, "dial-identify", addr))
            assert report["agent"].startswith("volunteer/") and ECHO in report["protocols"], report
            assert report["observed_addr"].startswith("/ip4/127.0.0.1/tcp/")
            # py-libp2p's own perf client (PerfService) against our perf server: exact byte counts.
            report = await trio.to_thread.run_sync(
                partial(run_pylibp2p, pylibp2p_python, "dial-perf", addr, "--upload", "1000001", "--download", "3000003")
            )
            assert report["ok"] and report["uploaded"] == 1_000_001 and report["downloaded"] == 3_000_003, report
            assert host.service(PerfServer).stats.bytes_received == 1_000_001 and host.service(PerfServer).stats.bytes_sent == 3_000_003
