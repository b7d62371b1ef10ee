"""The daemon's control channel: Unix socket 0600, the loopback-TCP fallback with its token, errors;
the daemon answering it around a running node."""

from __future__ import annotations

import json
import os
import stat

import pytest
import trio

from volunteer.cli.control import ControlError, DaemonLock, compute_seconds, request, serve_control
from volunteer.cli.daemon import Daemon, DaemonOptions
from volunteer.net.identity import KeyPair
from volunteer.node import VolunteerOptions
from volunteer.swarmfile import SwarmSpec


async def handler(message: dict) -> dict:
    if message.get("cmd") == "status":
        return {"ok": True, "status": {"peer_id": "12D3KooWtest"}}
    return {"ok": False, "error": "unknown command"}


@pytest.mark.parametrize("mode", ["unix", "tcp"])
async def test_status_round_trip_and_permissions(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("VOLUNTEER_CONTROL", "tcp" if mode == "tcp" else "")
    path = tmp_path / "run" / "daemon.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, path, handler)
        reply = await request(path, "status")
        assert reply["status"]["peer_id"] == "12D3KooWtest"
        with pytest.raises(ControlError, match="unknown command"):
            await request(path, "explode")
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        # a second daemon on the same path is refused, on either channel, and its exit leaves
        # the first one's socket or port file alone
        with pytest.raises(ControlError, match="already running"):
            await serve_control(path, handler)
        with pytest.raises(ControlError, match="already running"):
            DaemonLock(path).acquire()
        assert (await request(path, "status"))["ok"]
        if mode == "unix":
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        else:
            marker = path.with_name(path.name + ".tcp")
            assert stat.S_IMODE(os.stat(marker).st_mode) == 0o600
            info = json.loads(marker.read_text())
            # without the token, a local stranger gets nothing
            stream = await trio.open_tcp_stream("127.0.0.1", info["port"])
            await stream.send_all(b'{"cmd": "status"}\n')
            reply = json.loads((await stream.receive_some(4096)).decode())
            assert reply == {"ok": False, "error": "bad token"}
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert not path.exists() and not path.with_name(path.name + ".tcp").exists()
    DaemonLock(path).acquire().release()  # the first one's exit let the next daemon start


async def test_a_control_socket_deeper_than_sun_path_holds_still_answers(tmp_path, monkeypatch):
    """A deep temporary directory (pytest-xdist's, a long $TMPDIR) puts the socket's path past the
    108 bytes a Unix socket address holds: the daemon must still listen there and be reached."""
    monkeypatch.setenv("VOLUNTEER_CONTROL", "")
    path = tmp_path / ("d" * 60) / ("e" * 60) / "daemon.sock"
    assert len(str(path)) > 108
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, path, handler)
        assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert (await request(path, "status"))["status"]["peer_id"] == "12D3KooWtest"
        nursery.cancel_scope.cancel()
    assert not path.exists()


def test_one_lock_decides_whatever_the_channel(tmp_path):
    path = tmp_path / "run" / "daemon.sock"
    first = DaemonLock(path).acquire()
    with pytest.raises(ControlError, match=f"another daemon is already running with control socket {path}"):
        DaemonLock(path).acquire()
    first.release()
    second = DaemonLock(path).acquire()  # released (or its process gone): the next one takes it
    assert second.held and stat.S_IMODE(os.stat(second.lock_path).st_mode) == 0o600
    second.release()


async def test_no_daemon_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("VOLUNTEER_CONTROL", raising=False)
    with pytest.raises(ControlError, match="no daemon running"):
        await request(tmp_path / "none.sock", "status")


async def test_stale_socket_file_is_replaced(tmp_path, monkeypatch):
    monkeypatch.delenv("VOLUNTEER_CONTROL", raising=False)
    import socket

    path = tmp_path / "stale.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # a crashed daemon leaves its socket file behind
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, path, handler)
        assert (await request(path, "status"))["ok"]
        nursery.cancel_scope.cancel()


async def test_daemon_answers_status_pause_resume_and_leaves_on_request(tmp_path):
    keypair = KeyPair.generate()
    node = VolunteerOptions(keypair=keypair, listen=["/ip4/127.0.0.1/tcp/0"], nat=False, mdns=False)
    path = tmp_path / "run" / "daemon.sock"
    daemon = Daemon(DaemonOptions(swarm=SwarmSpec("ctl", "ctl"), node=node, control_path=path))
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        status = (await request(path, "status"))["status"]
        assert status["peer_id"] == str(keypair.peer_id) and status["swarm"] == "ctl" and not status["paused"]
        assert status["listen_addrs"] and status["experts"] == [] and status["compute"]["device"] == "cpu"
        assert status["dht"]["experts_declared"] == 0 and "reachability" not in status  # NAT traversal off
        assert (await request(path, "pause"))["paused"] and (await request(path, "status"))["status"]["paused"]
        assert not (await request(path, "resume"))["paused"]
        await request(path, "leave")
        await daemon.wait_left()
    assert not path.exists()


async def test_a_leave_asked_while_starting_is_kept():
    node = VolunteerOptions(keypair=KeyPair.generate(), listen=["/ip4/127.0.0.1/tcp/0"], nat=False, mdns=False)
    daemon = Daemon(DaemonOptions(swarm=SwarmSpec("ctl", "ctl"), node=node))
    daemon.leave()  # Ctrl-C before the node was up
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        await daemon.wait_left()
    assert daemon.node is not None and daemon.node.leaving


async def test_compute_seconds_reads_each_daemon_and_gives_none_for_one_that_does_not_answer(tmp_path):
    async def busy(message: dict) -> dict:
        return {"ok": True, "status": {"contributions": {"session": {"compute_s": 12.5}}}}

    path = tmp_path / "run" / "daemon.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_control, path, busy)
        # the reader blocks (benchmarks call it between steps), so it runs on a thread with its own trio run
        seconds = await trio.to_thread.run_sync(compute_seconds, [path, tmp_path / "gone" / "daemon.sock"])
        nursery.cancel_scope.cancel()
    assert seconds == [12.5, None]
