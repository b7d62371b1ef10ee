"""Corroboration of fetched states (volunteer/replicas/corroborate.py): which states agree (on
probe inputs and in parameters), and what a state shows of itself."""

from __future__ import annotations

import torch

from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.distance import distance
from volunteer.replicas.config import ReplicasConfig
from volunteer.replicas.catchup import Fetched, believed_side
from volunteer.replicas.corroborate import PROBE_BATCH, agree, evidence_of, probe_inputs
from volunteer.replicas.state import export_state

CPU = ExpertsConfig(device="cpu")


def trained(seed: int, steps: int = 3):
    torch.manual_seed(seed)
    backend = make_backend("rep.0", "ffn", 8, config=CPU)
    for _ in range(steps):
        backend.backward([torch.randn(4, 8)], [torch.randn(4, 8)])
    return backend


CONFIG = ReplicasConfig()


def evidence(reader, served, probes):
    exported = export_state(served)
    return evidence_of(reader, exported.header, b"".join(bytes(c) for c in exported.chunks), probes)


def test_a_states_answers_are_its_modules_and_the_readers_module_is_untouched():
    served, reader = trained(1), trained(2)
    before = [p.detach().clone() for p in reader.module.parameters()]
    probes = probe_inputs(reader, seed=7)
    assert probes is not None and probes[0].shape == (PROBE_BATCH, 8)
    got = evidence(reader, served, probes)
    with torch.no_grad():
        assert torch.allclose(got.answers[0], served.module(probes[0]), atol=1e-6)
    own = torch.cat([p.detach().reshape(-1) for _, p in sorted(served.module.state_dict().items())])
    assert torch.equal(got.parameters, own) and distance([got.parameters], [own]) == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, reader.module.parameters()))


def test_probes_are_drawn_afresh_unless_seeded():
    backend = trained(1)
    assert torch.equal(probe_inputs(backend, seed=3)[0], probe_inputs(backend, seed=3)[0])
    assert not torch.equal(probe_inputs(backend)[0], probe_inputs(backend)[0])


def test_replicas_a_few_steps_apart_agree_and_a_negated_or_fresh_state_does_not():
    honest = trained(1)
    drifted = trained(1)
    for _ in range(3):  # a few more steps of its own since they were equal
        drifted.backward([torch.randn(4, 8)], [torch.randn(4, 8)])
    negated = trained(1)
    with torch.no_grad():
        for p in negated.module.parameters():
            p.neg_()
    fresh = make_backend("rep.0", "ffn", 8, config=CPU)
    probes = probe_inputs(honest, seed=11)
    liar, a, b, other = (evidence(honest, s, probes) for s in (negated, honest, drifted, fresh))
    assert agree(a, b, CONFIG) and not agree(liar, a, CONFIG) and not agree(liar, b, CONFIG)
    # a fresh initialisation answers much like a barely trained residual block: its parameters
    # tell it apart (independent initialisations are about 1.4 apart)
    assert distance([other.parameters], [a.parameters]) > 1.0
    assert not agree(other, a, CONFIG)


def test_a_state_is_believed_when_nothing_contradicts_it_or_standing_settles_it_never_by_count():
    honest = trained(1)
    drifted = trained(1)
    for _ in range(3):
        drifted.backward([torch.randn(4, 8)], [torch.randn(4, 8)])
    negated = trained(1)
    with torch.no_grad():
        for p in negated.module.parameters():
            p.neg_()
    probes = probe_inputs(honest, seed=11)

    def fetched(source, served):
        return Fetched(source, export_state(served).header, bytearray(), evidence(honest, served, probes))

    h, d, s1, s2 = fetched("h", honest), fetched("d", drifted), fetched("s1", negated), fetched("s2", negated)
    assert believed_side([h, d], set(), CONFIG) == [h, d]  # all agree
    # two sybils serving one lie agree with each other: two of three is no reason to believe them
    assert believed_side([s1, s2, h], set(), CONFIG) is None
    assert believed_side([h, d, s1], set(), CONFIG) is None  # nor the two honest ones, by count
    # standing settles it: the side of the sources we proved before, however few
    assert believed_side([s1, s2, h], {"h"}, CONFIG) == [h]
    assert believed_side([h, d, s1], {"d"}, CONFIG) == [h, d]
    assert believed_side([s1, h], {"s1", "h"}, CONFIG) is None  # proven sources that disagree
