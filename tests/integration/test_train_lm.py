"""examples/train_lm.py's language model, reduced (width 32, 2 blocks of 4 experts, 40 steps of 8
windows of 32 bytes), trained through two volunteers on loopback and trained locally from the
same seed on the same batches, the volunteers' experts starting from the local run's weights
(as the example's testnet does): the two curves stay together.

The bands, on every step's training loss and every validation figure: 0.5 % with lossless
tensors, 1 % with 8-bit blockwise ones. Every chosen expert answers (k_min = k) and the experts
step on the volunteers as the local ones step in the trainer, so a lossless run is the local run
bit for bit (gap 0.0 in our runs) and an 8-bit one differs by its rounding alone (gaps under
0.02 %). A lost gradient, a dropped expert or a wrong weight moves them by far more; the test
also counts the volunteers' updates and asserts that no call failed and no token went short."""

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
from volunteer.experts.backend import make_backend  # noqa: E402
from volunteer.experts.guard import ReplyGuard  # noqa: E402
from volunteer.experts.trust import TrustLedger  # noqa: E402
from volunteer.swarm import Swarm  # noqa: E402

from .volunteer_fixture import DHT_CONFIG, Volunteer  # noqa: E402

SIZE = lm_parts.SIZES["tiny"]
LOSSLESS_BAND = 0.005
LOSSY_BAND = 0.01


def _args(compression: str = "auto") -> argparse.Namespace:
    return argparse.Namespace(seed=0, device="cpu", compression=compression, size="tiny", volunteers=2)


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
    experts = lm_parts.initial_experts("ffn", 8, lm_parts.expert_uids("lm0", (4,)), seed=1)
    mixture = lm_parts.LocalMixture(8, (4,), 2, list(experts.values()))
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


def _backends(uids: list[str], first: dict, width: int) -> list:
    backends = []
    for uid in uids:
        backend = make_backend(uid, train_lm.EXPERT_CLASS, width)
        backend.module.load_state_dict(first[uid].state_dict())
        backends.append(backend)
    return backends


@pytest.fixture(scope="module")
def local_run(corpus):
    losses: list[float] = []
    curve, _, _ = train_lm.train(SIZE, corpus, None, _args(), "local", losses_out=losses)
    return curve, losses


@pytest.mark.slow
@pytest.mark.parametrize("compression, band", [("none", LOSSLESS_BAND), ("blockwise8_64", LOSSY_BAND)])
def test_swarm_and_local_curves_stay_within_the_band(corpus, local_run, compression, band):
    uids = train_lm.all_uids(SIZE)
    first = lm_parts.initial_experts(train_lm.EXPERT_CLASS, SIZE.width, uids, train_lm.experts_seed(_args()))
    volunteers = [Volunteer(uids[::2], hidden=SIZE.width, backends=_backends(uids[::2], first, SIZE.width))]
    volunteers.append(Volunteer(uids[1::2], hidden=SIZE.width, backends=_backends(uids[1::2], first, SIZE.width),
                                bootstrap=[volunteers[0].addr]))
    swarm = Swarm.join(volunteers[0].spec(), dht_config=DHT_CONFIG)
    remote: list[float] = []
    try:
        curve, model, timing = train_lm.train(SIZE, corpus, swarm, _args(compression), "swarm", losses_out=remote)
        stats = [m.stats for m in model.mixtures]
        assert sum(s["failures"] for s in stats) == 0 and sum(s["samples_short"] for s in stats) == 0
        updates = sum(b.updates for v in volunteers for b in v.runtime.backends.values())
        assert updates >= SIZE.steps * SIZE.layers  # every layer's experts stepped on every step
    finally:
        swarm.close()
        for v in volunteers:
            v.stop()
    local_curve, local = local_run

    assert curve.steps == local_curve.steps
    assert local_curve.bpb[-1] < local_curve.bpb[0] < 8  # it learns (uniform bytes: 8 bits)
    for step, swarm_bpb, local_bpb in zip(local_curve.steps, curve.bpb, local_curve.bpb):
        assert abs(swarm_bpb / local_bpb - 1) < band, (step, swarm_bpb, local_bpb)
    for step, (swarm_loss, local_loss) in enumerate(zip(remote, local), 1):
        assert math.isfinite(swarm_loss)
        assert abs(swarm_loss / local_loss - 1) < band, (step, swarm_loss, local_loss)
    assert timing["in_mixtures_train_s"] > 0


class _NoSwarm:
    """Enough of a swarm for a RemoteMixtureOfExperts to be built (no calls are made)."""

    spec = argparse.Namespace(grids=[])
    guard = ReplyGuard(TrustLedger())

    def publish_proof(self, proof) -> None:  # no calls, so no audit proves anything
        pass

    def __bool__(self) -> bool:
        return True
