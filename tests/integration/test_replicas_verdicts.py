"""Replicas act on checked proofs (real volunteers on loopback, a swarm with receipts): a liar
whose signed reply another peer proved false is no catch-up source, no sync partner and carries
no weight in a round, for a joiner that never dealt with it; an accusation that does not check
out changes nothing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
import trio

from volunteer.cli.expertscmd import check_verdicts
from volunteer.dht.verdicts import Accusation, accusation_items
from volunteer.experts.callstats import CallReport
from volunteer.experts.client import call_expert
from volunteer.experts.verdicts import evidence_of
from volunteer.node import open_volunteer
from volunteer.replicas.exclusions import PROVEN_LIAR
from volunteer.replicas.state import state_digest

from .test_replicas_node import GRID, HIDDEN, SWARM, _has_version, options, train, until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from lying_volunteer import lie_in_module  # noqa: E402


def spec(*bootstrap):
    from volunteer.swarmfile import SwarmSpec

    return SwarmSpec(SWARM, SWARM, list(bootstrap), [], grids=[GRID], receipts=True)


async def accuse(accuser, accused, uid: str, *, swarm: str = SWARM) -> None:
    """``accuser`` calls ``accused`` for ``uid`` and publishes the signed reply as a proof (a
    true one when ``accused`` lies, a forged one when it does not)."""
    x = torch.randn(4, HIDDEN)
    report = CallReport()
    outputs = await call_expert(accuser.host, accused.host.peer_id, uid, "forward", [x], swarm_id=swarm, report=report)
    assert report.receipt is not None
    evidence = evidence_of(report.receipt, [x], outputs)
    assert evidence is not None
    keys = accuser.host.keypair
    accusation = Accusation(swarm, keys.peer_id.to_bytes(), accused.host.peer_id.to_bytes(), uid, time.time(),
                            evidence.encode()).sign(keys)
    stored = await accuser.dht.store_many(accusation_items(accusation, time.time() + 600))
    assert all(stored), stored


async def negated_liar(node, uid: str, version: int) -> None:
    """Make ``node``'s ``uid`` the honest state's opposite (plausible, but no replica's) at
    ``version``, and its forwards ×1.5 what that state computes: a lie a recompute proves."""
    backend = node.runtime.backends[uid]
    with torch.no_grad():
        for p in backend.module.parameters():
            p.neg_()
    backend.updates = version
    lie_in_module(backend.module, lambda out: out * 1.5)
    node.declarer.resume()


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
@pytest.mark.parametrize("proven", [True, False], ids=["proof-checked", "honest-reply-accused"])
async def test_a_proven_liar_is_no_catch_up_source_and_no_sync_partner(proven):
    uid = "rep.0"
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(uids=[uid])) as honest, \
                open_volunteer(spec(entry), options(uids=[uid])) as liar:
            await train(honest, uid, 3)
            honest.declarer.resume()
            await negated_liar(liar, uid, 3)
            await until(lambda: _has_version(seed.dht, uid, str(honest.host.peer_id), 3), "honest declared")
            await until(lambda: _has_version(seed.dht, uid, str(liar.host.peer_id), 3), "liar declared")
            # the seed (any peer) caught the liar; or, as a forger, accuses the honest host of its true reply
            await accuse(seed, liar if proven else honest, uid)
            # what ``volunteer experts`` shows of the two hosts, checked by its own recompute
            accused = liar if proven else honest
            shown = await check_verdicts(spec(entry), [str(honest.host.peer_id), str(liar.host.peer_id)])
            if proven:
                assert list(shown["excluded"]) == [str(liar.host.peer_id)] and shown["unproven"] == {}, shown
            else:
                assert shown["excluded"] == {} and list(shown["unproven"]) == [str(accused.host.peer_id)], shown
            async with open_volunteer(spec(entry), options(uids=[uid])) as joiner:
                snapshot = joiner.replicas.snapshot()
                joined = state_digest(joiner.runtime.backends[uid])
                if not proven:
                    # nothing changed: the two states still disagree and nothing settles it
                    assert snapshot["proven_liars"] == [] and PROVEN_LIAR not in snapshot["refusals"]
                    assert joined != state_digest(honest.runtime.backends[uid])
                    return
                liar_id = str(liar.host.peer_id)
                assert snapshot["proven_liars"] == [liar_id], snapshot
                assert joined == state_digest(honest.runtime.backends[uid])  # the liar was no source
                assert snapshot["standings"][uid] == {str(honest.host.peer_id): "proven"}
                # a round of all three: the joiner neither sends to the liar nor merges what it sends
                async with trio.open_nursery() as nursery:
                    for node in (honest, liar, joiner):
                        nursery.start_soon(node.replicas.sync_grid, GRID)
                outcome = joiner.replicas.outcomes[uid]
                assert liar_id not in outcome.contributors and liar_id not in outcome.missing, outcome
                assert outcome.contributors == (str(honest.host.peer_id),), outcome
                assert joiner.replicas.sync.refusals[PROVEN_LIAR] >= 1
                assert all(torch.isfinite(p.detach()).all() for p in joiner.runtime.backends[uid].module.parameters())
