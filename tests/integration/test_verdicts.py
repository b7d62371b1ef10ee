"""Shared verdicts on real volunteers (in-process, loopback): a trainer that proved a liar publishes
the proof, and another trainer that never called the liar checks it by recompute and refuses the
liar too; an accusation against an honest host, stored as the real thing would be, changes
nothing for anyone."""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.dht.verdicts import Accusation, accusation_items
from volunteer.experts.callstats import CallReport
from volunteer.experts.verdicts import evidence_of
from volunteer.net.identity import PeerID

from .test_exact_audits import World, modules, times
from .test_moe_audits import DHT, HIDDEN, grid

WAIT = 60.0  # seconds a second trainer has to read and check a proof (its watcher reads every 10 s)


def wait_for(condition, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_trainer_that_never_called_a_liar_refuses_it_once_another_published_a_proof():
    world = World(1, [modules(times(1.02))])
    second = None
    try:
        liar, honest = world.liars[0].peer, world.honest[0].peer
        world.train_until(lambda: world.moe.trust.excluded(liar), steps=400)
        world.settle()
        assert world.swarm.trust_report()[liar]["excluded_on_proof"]
        wait_for(lambda: world.swarm.verdict_report()["published"] >= 1, "the proof to be published", 20)

        second = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        moe = RemoteMixtureOfExperts(second, in_features=HIDDEN, grid=grid(2), k_best=2)
        assert liar not in second.trust_report()  # never called it
        wait_for(lambda: second.trust_report().get(liar, {}).get("standing") == "excluded", "the proof to be checked")
        row = second.trust_report()[liar]
        assert row["excluded_on_proof"] and row["replies"] == 0, row
        assert row["excluded_because"].startswith(f"proof published by {world.swarm.host.peer_id}"), row
        assert row["proof"]["by"] == str(world.swarm.host.peer_id) and "recompute" in row["proof"]["reason"]
        assert second.verdict_report()["checks"] >= 1 and liar in second.verdict_report()["excluded"]
        # its mixture never picks the liar now, for any expert
        assert all(moe.trust.pick_weight(uid, liar) == 0.0 for uid in world.moe.live_experts())
        assert second.trust_report().get(honest, {}).get("standing") != "excluded"
    finally:
        if second is not None:
            second.close()
        world.close()


@pytest.mark.slow
def test_a_forged_accusation_against_an_honest_host_excludes_nobody():
    world = World(2, [])
    forger = None
    try:
        honest = world.honest[0].peer
        forger = Swarm.join(world.honest[0].spec(), dht_config=DHT)
        uid = sorted(world.moe.live_experts())[0]
        x = torch.randn(4, HIDDEN)
        report = CallReport()
        outputs = forger.loop.run(partial(forger.directory.call_expert, PeerID.from_string(honest), uid, "forward", [x],
                                          report=report))
        assert report.receipt is not None
        # a genuine receipt and the genuine reply, accused anyway; and the same receipt with a lie
        # put in place of the reply it names
        evidences = [evidence_of(report.receipt, [x], outputs)]
        assert evidences[0] is not None
        lie = evidence_of(report.receipt, [x], [o * 1.5 for o in outputs])
        assert lie is None  # the lie is not what the receipt names: it cannot even be built as evidence
        accusation = Accusation(forger.spec.id, forger.keypair.peer_id.to_bytes(), PeerID.from_string(honest).to_bytes(),
                                uid, time.time(), evidences[0].encode()).sign(forger.keypair)
        forger.loop.run(forger.dht.store_many, accusation_items(accusation, time.time() + 600))

        watch = world.swarm.verdicts
        assert watch is not None
        wait_for(lambda: world.swarm.verdict_report()["checks"] >= 1, "the accusation to be checked")
        assert world.swarm.verdict_report()["refused"].get("not_proven", 0) >= 1, world.swarm.verdict_report()
        assert world.swarm.verdict_report()["excluded"] == {}
        world.train_until(lambda: False, steps=5)
        assert world.swarm.trust_report().get(honest, {}).get("standing") != "excluded"
    finally:
        if forger is not None:
            forger.close()
        world.close()
