"""A sync round's bookkeeping (pure, time passed in): membership, arrivals, the deadline, members
that vanish, the average with missing members keeping our own values, our own version (only the
guard's verdict raises it)."""

from __future__ import annotations

import pytest
import torch

from volunteer.replicas.aggregate import mean
from volunteer.replicas.errors import StateMismatchError, SyncError
from volunteer.replicas.sync import SyncRound


def params(value: float):
    return [("w", torch.full((2, 3), value)), ("b", torch.full((3,), value))]


def tensors_of(round_):
    return [c.tensors for c in round_.contributions]


def make(members=("b", "c"), *, now=100.0, timeout=10.0, version=5, value=1.0):
    return SyncRound("e.0", "a", members, version, params(value), now=now, timeout=timeout)


def test_done_when_everyone_contributed_and_the_average_includes_all():
    round_ = make()
    assert round_.waiting == {"b", "c"} and not round_.done(100.0)
    round_.add("b", 7, dict(params(4.0)))
    assert not round_.done(101.0)
    round_.add("c", 3, dict(params(7.0)))
    assert round_.done(101.0)
    outcome = round_.finish()
    assert torch.allclose(mean(round_.params, tensors_of(round_))["w"], torch.full((2, 3), 4.0))
    assert outcome.version == 5 and outcome.contributors == ("b", "c") and outcome.missing == ()


def test_the_deadline_finishes_with_what_arrived():
    round_ = make(now=100.0, timeout=10.0)
    round_.add("b", 2, dict(params(3.0)))
    assert not round_.done(109.9)
    assert round_.done(110.0)
    outcome = round_.finish()
    averaged = mean(round_.params, tensors_of(round_))
    assert torch.allclose(averaged["b"], torch.full((3,), 2.0))  # (1 + 3) / 2: c left out
    assert outcome.version == 5 and outcome.missing == ("c",)


def test_a_member_that_vanishes_is_not_waited_for():
    round_ = make()
    round_.add("b", 9, dict(params(3.0)))
    round_.gone("c")
    assert round_.done(100.0)  # long before the deadline
    assert round_.finish().missing == ("c",)


def test_nobody_arrives_keeps_our_own_values_and_version():
    round_ = make()
    round_.gone("b")
    round_.gone("c")
    outcome = round_.finish()
    assert torch.equal(mean(round_.params, tensors_of(round_))["w"], torch.full((2, 3), 1.0))
    assert outcome.version == 5 and outcome.contributors == ()


def test_a_late_contribution_from_a_member_marked_gone_still_counts():
    round_ = make(members=("b",))
    round_.gone("b")  # our send to it failed ...
    round_.add("b", 1, dict(params(3.0)))  # ... but its own contribution reached us
    assert round_.finish().contributors == ("b",)


def test_alone_in_the_group_is_done_at_once():
    round_ = make(members=("a",))  # only ourselves
    assert round_.members == frozenset() and round_.done(100.0)


def test_misuse_is_refused():
    round_ = make()
    with pytest.raises(SyncError, match="not in the sync group"):
        round_.add("z", 1, dict(params(0.0)))
    round_.add("b", 1, dict(params(0.0)))
    with pytest.raises(SyncError, match="twice"):
        round_.add("b", 1, dict(params(0.0)))
    with pytest.raises(StateMismatchError):
        round_.add("c", 1, {"w": torch.zeros(3, 2), "b": torch.zeros(3)})
    with pytest.raises(StateMismatchError):
        round_.add("c", 1, {"w": torch.zeros(2, 3)})
    round_.finish()
    with pytest.raises(SyncError, match="finished"):
        round_.add("c", 1, dict(params(0.0)))


def test_average_keeps_the_parameter_dtype():
    round_ = SyncRound("e.0", "a", ["b"], 0, [("h", torch.ones(4, dtype=torch.float16))], now=0, timeout=1)
    round_.add("b", 0, {"h": torch.full((4,), 3.0, dtype=torch.float16)})
    round_.finish()
    averaged = mean(round_.params, tensors_of(round_))["h"]
    assert averaged.dtype == torch.float16 and torch.equal(averaged, torch.full((4,), 2.0, dtype=torch.float16))


def test_applying_a_round_keeps_the_steps_taken_while_it_was_open():
    from volunteer.experts import ExpertsConfig
    from volunteer.experts.backend import make_backend
    from volunteer.replicas.state import apply_parameters, sync_parameters

    backend = make_backend("e.0", "ffn", 4, config=ExpertsConfig(device="cpu"))
    base = dict(sync_parameters(backend))  # what the round was opened with
    averaged = {name: t + 1.0 for name, t in base.items()}  # the round moved every value by +1
    with torch.no_grad():  # an optimizer step while the round was open: +0.5 everywhere
        for p in backend.module.parameters():
            p.add_(0.5)
    backend.updates = 3
    apply_parameters(backend, averaged, version=9, base=base)
    for name, p in backend.module.named_parameters():
        assert torch.allclose(p, base[name] + 1.5)
    assert backend.updates == 9
    # without a base (or without training in between) the average is written as it is
    apply_parameters(backend, averaged, version=2)
    for name, p in backend.module.named_parameters():
        assert torch.allclose(p, averaged[name])
    assert backend.updates == 9


def test_the_mean_of_nothing_is_our_own_and_a_round_applies_any_aggregate_as_its_change():
    from volunteer.experts import ExpertsConfig
    from volunteer.experts.backend import make_backend
    from volunteer.replicas.config import ReplicasConfig
    from volunteer.replicas.guard import Contributed, SyncGuard
    from volunteer.replicas.state import merge_round, sync_parameters

    own = dict(params(1.0))
    assert all(torch.equal(mean(own, [])[name], own[name]) for name in own)
    backend = make_backend("e.0", "ffn", 4, config=ExpertsConfig(device="cpu"))
    base = dict(sync_parameters(backend))
    theirs = [{name: t + 2.0 for name, t in base.items()}, {name: t + 4.0 for name, t in base.items()}]
    claims = [Contributed("b", 7, theirs[0]), Contributed("c", 8, theirs[1])]
    # peers with standing, two steps apart at once: the mechanics alone, not what a round believes
    guard = SyncGuard(ReplicasConfig(sync_bootstrap_share=1e6))
    guard.vouch("e.0", "b")
    guard.vouch("e.0", "c")
    seen = []

    def first_only(mine, contributions):  # another aggregate: the seam a robust one plugs into
        seen.append((mine, contributions))
        return dict(contributions[0])

    with torch.no_grad():  # a step while the round was open
        for p in backend.module.parameters():
            p.add_(0.5)
    backend.updates = 6
    merge_round(backend, base, claims, guard, first_only)
    # the lower median of the versions (6, 7, 8): two of three replicas are at 7 or beyond
    assert seen == [(base, theirs)] and backend.updates == 7
    for name, p in backend.module.named_parameters():
        assert torch.allclose(p, base[name] + 2.5)
    merge_round(backend, base, claims, guard, mean)  # (0 + 2 + 4) / 3 over the base
    for name, p in backend.module.named_parameters():
        assert torch.allclose(p, base[name] + 4.5)
    assert backend.updates == 7
