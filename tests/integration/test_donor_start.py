"""How a donor's daemon starts: without consent it joins nothing (no dial, no DHT, no experts, no
state fetched) until a fold, which then joins; with consent, the run-when policies are looked at
before anything is declared, so a start on battery is paused from its first moment."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from volunteer.cli import daemon as daemon_module
from volunteer.cli.control import request
from volunteer.cli.daemon import Daemon, DaemonOptions
from volunteer.donor.policy import settings_from
from volunteer.dht.grid import get_experts
from volunteer.node import open_volunteer

from .test_donor_steward import UIDS, Machine, options, spec, until


async def test_a_declined_consent_joins_nothing_until_fold(tmp_path):
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        node = options(expert_class="ffn", uids=UIDS, hidden_dim=8)
        path = tmp_path / "d.sock"
        daemon = Daemon(DaemonOptions(swarm=spec(entry), node=node, control_path=path, folding=False,
                                      start_reason="waiting for your consent: `volunteer fold` starts"))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(daemon.run)
                await trio.sleep(0.5)  # room for a dial, were one made
                assert daemon.node is None  # no host, no DHT, no experts placed or fetched
                assert not seed.host.connections()  # nobody dialled the swarm
                status = (await request(path, "status"))["status"]
                assert status["paused"] and status["state_text"].startswith("paused until you agree")
                assert status["experts"] == [] and "connections" not in status and status["joined"] is False
                from volunteer.cli.dashboard import render_text

                shown = render_text(status, width=120, height=60)
                assert "not joined: nothing dialled" in shown and "server mode" not in shown
                assert (await request(path, "pause"))["paused"] and daemon.node is None  # changes nothing
                reply = await request(path, "fold")
                assert reply["ok"] and "joining the swarm" in reply["text"]
                await daemon.joined.wait()
                await until(lambda: daemon.node.declarer.declarations >= 1)
                assert all((await get_experts(seed.dht, UIDS)).values())
                daemon.leave()
                await daemon.wait_left()


async def test_a_leave_before_consent_ends_without_joining(tmp_path):
    daemon = Daemon(DaemonOptions(swarm=spec(), node=options(), control_path=tmp_path / "d.sock", folding=False))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            daemon.leave()
            await daemon.wait_left()
    assert daemon.node is None


def ffn_daemon(machine: Machine) -> Daemon:
    """A daemon hosting the test's ffn experts, its run-when policy reading ``machine``."""
    return Daemon(DaemonOptions(swarm=spec(), node=options(expert_class="ffn", uids=UIDS, hidden_dim=8),
                                policy=settings_from({}), probe=machine))


async def test_a_start_on_battery_is_paused_before_anything_is_declared(monkeypatch):
    seen: list[bool] = []
    real = daemon_module.open_volunteer

    @asynccontextmanager
    async def watched(swarm, opts):
        async with real(swarm, opts) as node:
            seen.append(node.paused)  # as the node comes up, before the steward has looked
            yield node

    monkeypatch.setattr(daemon_module, "open_volunteer", watched)
    machine = Machine(battery=True)
    daemon = ffn_daemon(machine)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            assert seen == [True] and daemon.node.paused and daemon.node.declarer.declarations == 0
            assert [(e.action, e.origin) for e in daemon.conduct.events] == [("fold", "start"), ("paused", "policy")]
            machine.battery = False
            daemon.steward.sample()
            await until(lambda: not daemon.node.paused)
            daemon.leave()
            await daemon.wait_left()


async def test_the_donors_own_actions_are_notices_not_warnings(caplog):
    """fold and pause, by hand or by a run-when policy, log at INFO; WARN stays for problems."""
    import logging

    caplog.set_level(logging.INFO)
    machine = Machine(battery=False)
    daemon = ffn_daemon(machine)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            machine.battery = True
            daemon.steward.sample()
            await until(lambda: daemon.node.paused)
            machine.battery = False
            daemon.steward.sample()
            await until(lambda: not daemon.node.paused)
            assert (await daemon.ask("pause", "cli"))["paused"]
            assert not (await daemon.ask("fold", "cli"))["paused"]
            daemon.leave()
            await daemon.wait_left()
    lines = {(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("volunteer")}
    for notice in ("paused (policy): on battery", "resume (policy): run-when policies allow it", "pause (cli)", "fold (cli)"):
        assert ("INFO", notice) in lines, lines
    assert not [line for line in lines if line[0] == "WARNING"], lines
    assert not [r for r in daemon.logs.records if r.get("event")]  # the Log panel keeps problems only



async def blackholing_proxy(target_port: int, dead: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A TCP proxy to ``target_port`` that, once ``dead`` is set, swallows every byte both ways
    and keeps the connections open: a relay whose machine went away without a word."""

    async def pump(source, sink) -> None:
        while data := await source.receive_some(65536):
            if not dead.is_set():
                await sink.send_all(data)

    async def handle(client) -> None:
        upstream = await trio.open_tcp_stream("127.0.0.1", target_port)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, upstream)
            nursery.start_soon(pump, upstream, client)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(handle, listeners)


async def test_a_relay_that_died_is_said_in_status_not_left_green():
    """The only relay's machine goes silent after the donor reserved on it (its connection stays
    open, nothing answers): status, the dashboard and the state text say it stopped answering,
    instead of a frozen round trip beside "running"."""
    from relay.node import open_relay_node
    from volunteer.cli.dashboard import render_text
    from volunteer.dht import DHTConfig
    from volunteer.net.identity import KeyPair
    from volunteer.net.multiaddr import Multiaddr
    from volunteer.net.stack import StackOptions
    from volunteer.node import VolunteerOptions
    from volunteer.swarmfile import SwarmSpec

    swarm = "relaydies"
    dead = trio.Event()
    with trio.fail_after(60):
        async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], swarms=[swarm]) as relay, \
                trio.open_nursery() as nursery:
            real = relay.host.full_addrs()[0]
            port = await nursery.start(blackholing_proxy, int(real.value_for("tcp")), dead)
            via = Multiaddr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{relay.host.peer_id}")
            # no AutoNAT servers: on loopback they would call us public, and public needs no relay
            node = VolunteerOptions(listen=["/ip4/127.0.0.1/tcp/0"], keypair=KeyPair.generate(), mdns=False,
                                    dht_config=DHTConfig(swarm_id=swarm), nat_servers=[], stack=StackOptions(perf=None))
            daemon = Daemon(DaemonOptions(swarm=SwarmSpec(swarm, swarm, [via], [via]), node=node, relay_check_period=0.1))
            await nursery.start(daemon.run)

            def relays() -> list[dict]:
                return [r for r in daemon.snapshot().get("reachability", {}).get("relays", []) if r.get("reserved")]

            await until(lambda: any(r.get("answering") for r in relays()), timeout=40)
            assert "relay_warning" not in daemon.snapshot()
            dead.set()
            await until(lambda: any(r.get("answering") is False for r in relays()), timeout=40)
            snap = daemon.snapshot()
            assert "not answering for" in snap["state_text"] and "not answering" in snap["reachable_how"]
            assert "NOT ANSWERING" in render_text(snap, width=160, height=60)
            with trio.move_on_after(5):
                daemon.leave()
                await daemon.wait_left()
            nursery.cancel_scope.cancel()


async def test_status_splits_the_upload_by_purpose():
    """status --json counts each kind of upload apart, as the README says: replies to trainers,
    replica sync, catch-up served and hand-off, beside their total."""
    from volunteer.net.upload import PURPOSES

    daemon = ffn_daemon(Machine(battery=False))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            upload = daemon.snapshot()["upload"]
            assert set(upload["by_purpose"]) == set(PURPOSES)
            assert sum(upload["by_purpose"].values()) == upload["bytes_sent"]
            daemon.leave()
            await daemon.wait_left()


async def test_status_names_the_event_log(tmp_path):
    daemon = Daemon(DaemonOptions(swarm=spec(), node=options(), folding=False, log_file=tmp_path / "logs" / "volunteer.log"))
    assert daemon.snapshot()["log_file"] == str(tmp_path / "logs" / "volunteer.log")
    assert "log_file" not in Daemon(DaemonOptions(swarm=spec(), node=options(), folding=False)).snapshot()


def test_a_paused_volunteer_pings_no_relay(monkeypatch):
    """The relay watch pings the relays the node holds reservations on, except while paused."""
    from types import SimpleNamespace

    from volunteer.cli import views

    peer = "12D3KooWRelayRelayRelay"
    monkeypatch.setattr(views, "reachability_view", lambda node: {"relays": [{"peer_id": peer, "reserved": True}]})
    assert daemon_module.relays_to_ping(SimpleNamespace(paused=False)) == [peer]
    assert daemon_module.relays_to_ping(SimpleNamespace(paused=True)) == []
