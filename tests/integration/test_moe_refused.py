"""A trainer whose backwards a volunteer refuses (the swarm file lists other trainers) hears it in
one line, not once per call, and its training goes on without that volunteer's gradients."""

from __future__ import annotations

import logging

import torch

from volunteer import RemoteMixtureOfExperts, Swarm
from volunteer.net.identity import KeyPair

from .volunteer_fixture import DHT_CONFIG, Volunteer

GRID = ["expert.0.0", "expert.0.1"]
HIDDEN = 8


def test_a_refused_trainer_is_told_once_per_volunteer_and_changes_nothing(caplog):
    volunteer = Volunteer(GRID, hidden=HIDDEN, trainers=[str(KeyPair.generate().peer_id)])  # someone else
    try:
        with Swarm.join(volunteer.spec(), dht_config=DHT_CONFIG) as swarm:
            moe = RemoteMixtureOfExperts(swarm, in_features=HIDDEN, grid_size=(1, 2), uid_prefix="expert", k_best=2,
                                         forward_timeout=5, backward_timeout=5)
            assert sorted(moe.live_experts(refresh=True)) == GRID
            with caplog.at_level(logging.INFO, logger="volunteer.experts"):
                for _ in range(3):
                    x = torch.randn(4, HIDDEN, requires_grad=True)
                    moe(x).pow(2).sum().backward()  # forwards answered, backwards refused: no raise
            told = [r for r in caplog.records if "refuses our backwards" in r.getMessage()]
            assert len(told) == 1 and told[0].levelno == logging.WARNING
            assert "not an admitted trainer" in told[0].getMessage()
            assert all(volunteer.runtime.info(uid)["updates"] == 0 for uid in GRID)
    finally:
        volunteer.stop()
