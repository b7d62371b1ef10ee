"""examples/train_lm.py's language model, reduced (width 32, 2 blocks of 4 experts, 40 steps of 8
windows of 32 bytes), trained through two volunteers on loopback and trained locally from the
same seed on the same batches: the two curves stay together.

The band: at every validation step the swarm's bits per byte is within 3 % of the local run's, and
every step's training loss within 5 %. Loopback tensors travel losslessly (``auto`` sends them as
they are), every chosen expert answers (k_min = k), and the experts step on the volunteers as the
local ones step in the trainer: what differs is the experts' initial weights (each volunteer draws
its own) and the order of floating-point sums. Local runs from 30 different expert
initialisations stayed within 0.8 % of one another on both figures, a quarter of the band or less.
A small model learns little in 40 steps, so the band alone would not notice experts that never
learn (frozen, they moved the figures by 2.5 % at most): the test counts the volunteers' updates
and asserts that no call failed and no token went short of its experts."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import lm_parts  # noqa: E402
import train_lm  # noqa: E402
from volunteer.experts.guard import ReplyGuard  # noqa: E402
from volunteer.experts.trust import TrustLedger  # noqa: E402
from volunteer.swarm import Swarm  # noqa: E402

from .volunteer_fixture import DHT_CONFIG, Volunteer  # noqa: E402

VALIDATION_BAND = 0.03
TRAIN_BAND = 0.05


def _args(compression: str = "auto") -> argparse.Namespace:
    return argparse.Namespace(seed=0, device="cpu", compression=compression, size="tiny")


@pytest.fixture(scope="module")
def corpus() -> lm_parts.Corpus:
    return lm_parts.Corpus.load(lm_parts.SIZES["tiny"].train_bytes, train_lm.VAL_BYTES)


def test_trainer_parameters_are_the_same_in_both_modes():
    size = lm_parts.SIZES["tiny"]
    local = train_lm.build(size, None, _args())
    remote = train_lm.build(size, _NoSwarm(), _args())
    shared = {k: v for k, v in local.state_dict().items() if ".experts." not in k}
    assert shared.keys() == remote.state_dict().keys()
    for key, value in shared.items():
        assert torch.equal(value, remote.state_dict()[key]), key


def test_local_mixture_routes_each_token_to_its_k_best_experts():
    torch.manual_seed(0)
    mixture = lm_parts.LocalMixture(8, (4,), 2, "ffn", experts_seed=1)
    x = torch.randn(5, 3, 8)
    out = mixture(x)
    assert out.shape == x.shape
    scores = mixture.gate(x.reshape(-1, 8))
    top = scores.topk(2, dim=-1)
    weights = torch.softmax(top.values, dim=-1)
    flat = x.reshape(-1, 8)
    expected = torch.stack([
        sum(w * mixture.experts[int(e)](flat[t : t + 1])[0] for w, e in zip(weights[t], top.indices[t]))
        for t in range(len(flat))
    ])
    assert torch.allclose(out.reshape(-1, 8), expected, atol=1e-5)
    out.sum().backward()
    assert mixture.called and mixture.gate.weight.grad is not None
    called = sorted(mixture.called)
    assert called == sorted(set(top.indices.flatten().tolist()))
    before = [[p.clone() for p in mixture.experts[e].parameters()] for e in range(4)]
    mixture.step_experts()
    assert not mixture.called
    for e in range(4):  # the called experts stepped, the others did not
        moved = any(not torch.equal(a, b) for a, b in zip(before[e], mixture.experts[e].parameters()))
        assert moved == (e in called), e


@pytest.mark.slow
def test_swarm_and_local_curves_stay_within_the_band(corpus):
    size = lm_parts.SIZES["tiny"]
    uids = [f"lm{layer}.{i}" for layer in range(size.layers) for i in range(size.experts)]
    first = Volunteer(uids[::2], hidden=size.width)
    second = Volunteer(uids[1::2], hidden=size.width, bootstrap=[first.addr])
    swarm = Swarm.join(first.spec(), dht_config=DHT_CONFIG)
    try:
        remote_curve, model, timing = train_lm.train(size, corpus, swarm, _args(), "swarm", losses_out=(remote := []))
        stats = [m.stats for m in model.mixtures]
        assert sum(s["failures"] for s in stats) == 0 and sum(s["samples_short"] for s in stats) == 0
        updates = sum(b.updates for v in (first, second) for b in v.runtime.backends.values())
        assert updates >= size.steps * size.layers  # every layer's experts stepped on every step
    finally:
        swarm.close()
        first.stop()
        second.stop()
    local_curve, _, _ = train_lm.train(size, corpus, None, _args(), "local", losses_out=(local := []))

    assert remote_curve.steps == local_curve.steps
    assert local_curve.bpb[-1] < local_curve.bpb[0] < 8  # it learns (uniform bytes: 8 bits)
    for step, swarm_bpb, local_bpb in zip(local_curve.steps, remote_curve.bpb, local_curve.bpb):
        assert abs(swarm_bpb / local_bpb - 1) < VALIDATION_BAND, (step, swarm_bpb, local_bpb)
    for step, (swarm_loss, local_loss) in enumerate(zip(remote, local), 1):
        assert math.isfinite(swarm_loss)
        assert abs(swarm_loss / local_loss - 1) < TRAIN_BAND, (step, swarm_loss, local_loss)
    assert timing["in_mixtures_train_s"] > 0


class _NoSwarm:
    """Enough of a swarm for a RemoteMixtureOfExperts to be built (no calls are made)."""

    spec = argparse.Namespace(grids=[])
    guard = ReplyGuard(TrustLedger())

    def __bool__(self) -> bool:
        return True
