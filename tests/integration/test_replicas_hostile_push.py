"""Unsolicited pushes, tried as an attacker would: a liar is an ordinary volunteer (its signed
declarations under its own key) that pushes an all-zero state at version 10⁹ with our own
``push_state``. A volunteer that hosts the expert keeps its own state; a full volunteer gives up
none of its experts for an expert other live hosts hold; a sole copy handed off is hosted at the
version its pusher declared, not the one its header claims. Loopback ``open_volunteer`` nodes."""

from __future__ import annotations

import pytest
import torch

from volunteer.cli import views
from volunteer.cli.metrics import refusals_of
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.replicas.errors import StateRefusedError
from volunteer.replicas.state import export_state, state_digest
from volunteer.replicas.placement import VERSION_CLAIM
from volunteer.replicas.transfer import UNSOLICITED_PUSH, push_state
from volunteer.node import open_volunteer

from .test_replicas_hostile_catchup import _redeclared
from .test_replicas_node import ALONE, CONFIG, GRID, HIDDEN, SWARM, _has_version, _holders, options, spec, train, until


def zeros_at_a_huge_version(uid: str):
    backend = make_backend(uid, "ffn", HIDDEN, config=ExpertsConfig(device="cpu"))
    with torch.no_grad():
        for p in backend.module.parameters():
            p.zero_()
    backend.updates = 10**9
    return export_state(backend)


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_a_push_never_replaces_a_hosted_expert():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(uids=["rep.0"])) as honest, \
                open_volunteer(spec(entry), options(uids=["rep.0"])) as liar:
            await train(honest, "rep.0", 3)
            digest = state_digest(honest.runtime.backends["rep.0"])
            await until(lambda: _holders(seed.dht, "rep.0", 2), "both declared")
            with pytest.raises(StateRefusedError) as info:
                await push_state(liar.host, honest.host.peer_id, zeros_at_a_huge_version("rep.0"),
                                 swarm_id=SWARM, config=CONFIG)
            assert info.value.code == "hosted"
            kept = honest.runtime.backends["rep.0"]
            assert state_digest(kept) == digest and kept.updates == 3
            assert honest.replicas.state.refusals[UNSOLICITED_PUSH] == 1
            # visible where an operator looks: `volunteer status --json` and the metrics
            assert views.refusals_view(honest)["replicas"] == {UNSOLICITED_PUSH: 1}
            assert refusals_of(honest)["replicas"] == {UNSOLICITED_PUSH: 1}


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_a_full_volunteer_gives_up_nothing_for_a_pushed_expert_others_hold():
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        # full with rep.0, which the liar also declares (so rep.0 looks spare here); rep.1 is held
        # by another honest volunteer, and the liar pushes its own rep.1 of zeros
        async with open_volunteer(spec(entry), options(uids=["rep.0"], max_experts=1)) as full, \
                open_volunteer(spec(entry), options(uids=["rep.1"])), \
                open_volunteer(spec(entry), options(uids=["rep.0", "rep.1"], max_experts=2)) as liar:
            await until(lambda: _holders(seed.dht, "rep.0", 2), "rep.0 declared twice")
            await until(lambda: _holders(seed.dht, "rep.1", 2), "rep.1 declared twice")
            with pytest.raises(StateRefusedError) as info:
                await push_state(liar.host, full.host.peer_id, zeros_at_a_huge_version("rep.1"),
                                 swarm_id=SWARM, config=CONFIG)
            assert info.value.code == "replicated"
            assert full.runtime.uids == ["rep.0"]
            assert full.replicas.state.refusals[UNSOLICITED_PUSH] == 1
            # and a peer that does not even declare the expert is refused before anything else
            with pytest.raises(StateRefusedError) as info:
                await push_state(seed.host, full.host.peer_id, zeros_at_a_huge_version("rep.1"),
                                 swarm_id=SWARM, config=CONFIG)
            assert info.value.code == "unknown" and full.runtime.uids == ["rep.0"]


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_a_handed_off_sole_copy_is_not_hosted_at_the_version_its_pusher_claims():
    grids = (GRID, ALONE)
    async with open_volunteer(spec(grids=grids), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry, grids=grids), options(uids=["rep.0"], max_experts=2)) as receiver, \
                open_volunteer(spec(entry, grids=grids), options(uids=["solo.0"])) as liar:
            await train(liar, "solo.0", 2)
            await until(lambda: _redeclared(seed.dht, liar, "solo.0", 2), "liar declared version 2")
            # its own trained state (finite, plausible), under a header claiming version 10⁹
            claimed = make_backend("solo.0", "ffn", HIDDEN, config=ExpertsConfig(device="cpu"))
            claimed.module.load_state_dict(liar.runtime.backends["solo.0"].module.state_dict())
            claimed.updates = 10**9
            version = await push_state(liar.host, receiver.host.peer_id, export_state(claimed),
                                       swarm_id=SWARM, config=CONFIG)
            assert version == 2 and receiver.runtime.backends["solo.0"].updates == 2
            assert receiver.replicas.state.refusals[VERSION_CLAIM] == 1
            assert views.refusals_view(receiver)["replicas"] == {VERSION_CLAIM: 1}
            mine = str(receiver.host.peer_id)
            await until(lambda: _has_version(seed.dht, "solo.0", mine, 2), "receiver declares what the liar declared")
