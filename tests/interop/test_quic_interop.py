"""QUIC v1 interop, both directions: go-libp2p (p2pd v0.32) and py-libp2p 0.8.1 (its aioquic
transport) against our QUIC transport, through the Host and through `volunteer ping`/`perf`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial

import pytest
import trio

from volunteer.net.events import PeerIdentified
from volunteer.net.stack import open_stack
from volunteer.net.identity import PeerID
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.perf import PERF, perf_stream
from volunteer.net.identify import identify_of
from volunteer.net.ping import ping_of

from ..echo import echo, roundtrip
from .conftest import run_pylibp2p
from .peers import p2pd_control

pytestmark = pytest.mark.interop
ECHO = "/echo/1.0.0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
# py-libp2p 0.8.1's QUIC stream drops bytes once 2 MiB sit unread in it (stream.py,
# handle_data_received: "receive buffer overflow, dropping N bytes"; MAX_STREAM_RECEIVE_BUFFER in
# config.py): its credit follows aioquic's, which grows as bytes arrive, not as they are read.
# What we send it on one stream stays below that, so a test measures us, not that bug.
PYLIBP2P_SAFE = 1_500_000


def cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "volunteer", *args], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "VOLUNTEER_IDENTITY": str(tmp_path / "id.key")})


# --- go-libp2p ------------------------------------------------------------------------------------
async def test_we_dial_go_libp2p_over_quic_from_our_listen_port(p2pd_quic):
    assert "/quic-v1" in p2pd_quic.full_addr()
    with trio.fail_after(30):
        async with open_stack(listen=[QUIC]) as host:
            conn = await host.connect(p2pd_quic.full_addr())
            assert str(conn.remote_peer) == p2pd_quic.peer_id and conn.path_label == "direct quic"
            pinger = await ping_of(host).open(conn.remote_peer)
            rtts = [await pinger.ping() for _ in range(3)]
            assert all(0 < rtt < 5 for rtt in rtts)
            await pinger.aclose()
            info = await identify_of(host).ask(conn.remote_peer)
            assert "/ipfs/ping/1.0.0" in info.protocols and info.agent_version
            # go-libp2p sees the port we listen on: the dial left from the shared socket
            assert info.observed_addr == host.listen_addrs[0]
            # p2pd serves no /perf/1.0.0 (it has no flag for it): `volunteer perf` can only say so
            assert PERF not in info.protocols


async def test_go_libp2p_dials_us_over_quic_and_streams_data(p2pd_quic):
    with trio.fail_after(30):
        async with open_stack(listen=[QUIC]) as host:
            host.set_handler(ECHO, echo)
            with host.events.subscribe(PeerIdentified) as events:
                await p2pd_control.connect(p2pd_quic.control, host.peer_id.to_bytes(), [a.to_bytes() for a in host.addrs])
                async for event in events:
                    if str(event.peer) == p2pd_quic.peer_id:
                        break
            conn = host.connections(PeerID.from_string(p2pd_quic.peer_id))[0]
            assert conn.transport == "quic"
            stream, protocol = await p2pd_control.stream_open(p2pd_quic.control, host.peer_id.to_bytes(), [ECHO])
            assert protocol == ECHO
            payload = os.urandom(1_000_000)
            await stream.send_all(payload)
            assert await stream.receive_exactly(len(payload)) == payload
            await stream.aclose()


def test_volunteer_ping_and_perf_cli_over_quic_to_go_libp2p(p2pd_quic, tmp_path):
    result = cli("ping", "-c", "2", "-i", "0.1", p2pd_quic.full_addr(), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 sent, 2 received" in result.stdout and "over quic" in result.stdout and "transport=quic" in result.stdout
    result = cli("perf", "--upload", "1MiB", "--download", "1MiB", p2pd_quic.full_addr(), tmp_path=tmp_path)
    assert result.returncode == 1 and "does not speak /perf/1.0.0" in result.stderr and "Traceback" not in result.stderr


# --- py-libp2p ------------------------------------------------------------------------------------
async def test_we_dial_pylibp2p_over_quic(pylibp2p_quic_server):
    with trio.fail_after(60):
        async with open_stack(listen=[QUIC]) as host:
            conn = await host.connect(pylibp2p_quic_server)
            assert str(conn.remote_peer) == Multiaddr(pylibp2p_quic_server).peer_id.to_base58()
            assert conn.path_label == "direct quic"
            pinger = await ping_of(host).open(conn.remote_peer)
            assert 0 < await pinger.ping() < 5
            await pinger.aclose()
            info = await identify_of(host).ask(conn.remote_peer)
            assert ECHO in info.protocols and PERF in info.protocols
            payload = os.urandom(PYLIBP2P_SAFE)
            assert await roundtrip(await host.new_stream(conn.remote_peer, [ECHO]), payload) == payload
            # py-libp2p's own PerfService serving our perf client
            stream = await host.new_stream(conn.remote_peer, [PERF])
            uploaded, downloaded = [], []
            await perf_stream(stream, PYLIBP2P_SAFE, 4_000_005, uploaded.append, downloaded.append)
            assert sum(uploaded) == PYLIBP2P_SAFE and sum(downloaded) == 4_000_005


async def test_pylibp2p_dials_us_over_quic(pylibp2p_python):
    with trio.fail_after(120):
        async with open_stack(listen=[QUIC]) as host:
            host.set_handler(ECHO, echo)
            addr = str(host.full_addrs()[0])
            assert "/quic-v1/" in addr
            run = partial(run_pylibp2p, pylibp2p_python, "--quic")
            report = await trio.to_thread.run_sync(partial(run, "dial-echo", addr, "--size", str(PYLIBP2P_SAFE)))
            assert report["ok"] and report["bytes"] == PYLIBP2P_SAFE, report
            report = await trio.to_thread.run_sync(partial(run, "dial-ping", addr, "--count", "3"))
            assert report["ok"], report
            # no perf step here: py-libp2p 0.8.1's perf client over QUIC fails about 1 run in 8
            # against us (a short download, or an upload that ends with an empty error), at this
            # size and at 0.4 MB alike, and on the QUIC transport as first landed; our perf client
            # against its perf server over QUIC is tested below
            assert {c.transport for c in host.connections()} == {"quic"}


def test_volunteer_ping_and_perf_cli_over_quic_to_pylibp2p(pylibp2p_quic_server, tmp_path):
    result = cli("ping", "-c", "2", "-i", "0.1", pylibp2p_quic_server, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 sent, 2 received" in result.stdout and "transport=quic" in result.stdout
    result = cli("perf", "--json", "--upload", "1MiB", "--download", "4MiB", pylibp2p_quic_server, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["transport"] == "quic" and report["upload_bytes"] == 1 << 20 and report["download_bytes"] == 4 << 20
