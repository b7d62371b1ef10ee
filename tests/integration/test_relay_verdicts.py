"""The relay's health page checks published proofs itself (real volunteers on loopback, a swarm
with receipts): a liar proven by another peer is listed as excluded on proof, with who proved it;
an honest volunteer accused of its own true reply is not, and the accusation is counted."""

from __future__ import annotations

import pytest

from relay.healthservice import WatchedSwarm
from relay.node import open_relay_node
from volunteer.net.identity import KeyPair
from volunteer.node import open_volunteer
from volunteer.swarmfile import SwarmSpec

from .test_relay_health import GRID, SWARM, options, refreshed_until
from .test_replicas_verdicts import accuse, negated_liar


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_the_health_page_lists_a_proven_liar_and_not_a_falsely_accused_host():
    async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], swarms=[SWARM], web=("127.0.0.1", 0),
                               watched=[WatchedSwarm(SWARM, (GRID,))]) as relay:
        entry = relay.host.full_addrs()[0]
        spec = SwarmSpec(SWARM, SWARM, [], [entry], grids=[GRID], receipts=True)
        async with open_volunteer(spec, options(uids=["hx.0.0"], public_name="honest")) as honest, \
                open_volunteer(spec, options(uids=["hx.0.1"])) as liar:
            await negated_liar(liar, "hx.0.1", 0)
            await refreshed_until(relay, lambda m: m["swarms"][0]["grids"][0]["hosted"] == 2)
            await accuse(honest, liar, "hx.0.1", swarm=SWARM)  # true
            await accuse(liar, honest, "hx.0.0", swarm=SWARM)  # forged: its honest reply
            model = await refreshed_until(relay, lambda m: m["swarms"][0]["verdicts"]["count"] == 1
                                          and m["swarms"][0]["verdicts"]["refused"] >= 1)
            (row,) = model["swarms"][0]["verdicts"]["rows"]
            assert row["peer"] == str(liar.host.peer_id) and row["accuser"] == str(honest.host.peer_id), row
            assert row["uid"] == "hx.0.1" and "recompute" in row["reason"] and row["up"]
            # the forged accusation excluded nobody: the honest host is only counted among the refused
            assert str(honest.host.peer_id) not in {r["peer"] for r in model["swarms"][0]["verdicts"]["rows"]}
