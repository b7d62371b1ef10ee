"""Interop with go-libp2p (p2pd v0.32 from hivemind 1.1.12's wheel), both directions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from volunteer.net.events import PeerIdentified
from volunteer.net.stack import open_stack
from volunteer.net.identity import PeerID
from volunteer.net.identify import identify_of
from volunteer.net.ping import ping_of

from .peers import p2pd_control

pytestmark = pytest.mark.interop
ECHO = "/echo/1.0.0"


async def test_we_dial_go_libp2p_ping_and_identify(p2pd):
    with trio.fail_after(30):
        async with open_stack() as host:
            conn = await host.connect(p2pd.full_addr())
            assert str(conn.remote_peer) == p2pd.peer_id
            pinger = await ping_of(host).open(conn.remote_peer)
            rtts = [await pinger.ping() for _ in range(3)]
            assert all(0 < rtt < 5 for rtt in rtts)
            await pinger.aclose()
            info = await identify_of(host).ask(conn.remote_peer)
            assert info.peer_id == conn.remote_peer
            assert "/ipfs/ping/1.0.0" in info.protocols and "/ipfs/id/1.0.0" in info.protocols
            assert info.agent_version  # go-libp2p says who it is
            assert info.observed_addr is not None and str(info.observed_addr).startswith("/ip4/127.0.0.1/tcp/")


async def test_go_libp2p_dials_us_and_streams_data(p2pd):
    with trio.fail_after(30):
        async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"]) as host:
            received = []

            async def echo(stream):
                while data := await stream.receive_some(1 << 20):
                    received.append(len(data))
                    await stream.send_all(data)
                await stream.send_eof()

            host.set_handler(ECHO, echo)
            events = host.events.subscribe()
            # go-libp2p connects to us (its control socket asks it to) and runs identify on us.
            await p2pd_control.connect(p2pd.control, host.peer_id.to_bytes(), [a.to_bytes() for a in host.addrs])
            while True:
                event = await events.receive()
                if isinstance(event, PeerIdentified) and str(event.peer) == p2pd.peer_id:
                    break
            assert str(host.connections(PeerID.from_string(p2pd.peer_id))[0].remote_peer) == p2pd.peer_id
            # go-libp2p opens a stream on our protocol; bytes go through it and come back exact.
            stream, protocol = await p2pd_control.stream_open(p2pd.control, host.peer_id.to_bytes(), [ECHO])
            assert protocol == ECHO
            payload = os.urandom(300_000)
            await stream.send_all(payload)
            echoed = await stream.receive_exactly(len(payload))
            assert echoed == payload
            await stream.aclose()


def test_volunteer_ping_cli_reaches_go_libp2p(p2pd, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "volunteer", "ping", "-c", "2", "-i", "0.1", p2pd.full_addr()],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "VOLUNTEER_IDENTITY": str(tmp_path / "id.key")},
    )
    assert result.returncode == 0, result.stderr
    assert "2 sent, 2 received" in result.stdout and "path=direct" in result.stdout


def test_volunteer_perf_says_when_a_peer_does_not_speak_perf(p2pd, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "volunteer", "perf", "--upload", "1MiB", "--download", "1MiB", p2pd.full_addr()],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VOLUNTEER_IDENTITY": str(tmp_path / "id.key")},
    )
    assert result.returncode == 1
    assert "does not speak /perf/1.0.0" in result.stderr and "Traceback" not in result.stderr
