"""How a donor's daemon starts: without consent it joins nothing (no dial, no DHT, no experts, no
state fetched) until a fold, which then joins."""

from __future__ import annotations

import trio

from volunteer.cli.control import request
from volunteer.cli.daemon import Daemon, DaemonOptions
from volunteer.dht.grid import get_experts
from volunteer.node import open_volunteer

from .test_donor_steward import UIDS, options, spec, until


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

