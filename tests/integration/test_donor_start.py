"""How a donor's daemon starts: without consent it joins nothing (no dial, no DHT, no experts, no
state fetched) until a fold, which then joins; with consent, the run-when policies are looked at
before anything is declared, so a start on battery is paused from its first moment."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from volunteer.cli import daemon as daemon_module
from volunteer.cli.control import request
from volunteer.cli.daemon import Daemon, DaemonOptions
from volunteer.cli.policy import settings_from
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
                assert status["experts"] == [] and "connections" not in status
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
    daemon = Daemon(DaemonOptions(swarm=spec(), node=options(expert_class="ffn", uids=UIDS, hidden_dim=8),
                                  policy=settings_from({}), probe=machine))
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
    daemon = Daemon(DaemonOptions(swarm=spec(), node=options(expert_class="ffn", uids=UIDS, hidden_dim=8),
                                  policy=settings_from({}), probe=machine))
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
