"""The trainer's guard (volunteer/experts/guard.py): the scale statistic, the learned plausible
range per expert, and what a rejected reply does to the trust ledger. No trio, no network."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import ExpertConfigError, ImplausibleReplyError, NonFiniteReplyError
from volunteer.experts.guard import GuardConfig, RangeTracker, ReplyGuard, log_rms
from volunteer.experts.trust import Standing, TrustLedger, TrustPolicy

CONFIG = GuardConfig(warmup=16, window=64, refresh_every=4)


def honest(batch: int = 8, scale: float = 1.0, seed: int = 0) -> list[torch.Tensor]:
    return [torch.randn(batch, 16, generator=torch.Generator().manual_seed(seed)) * scale]


def test_log_rms():
    assert log_rms([torch.ones(3, 4), torch.ones(2)]) == pytest.approx(0.0, abs=1e-7)
    assert log_rms([torch.full((4,), 2.0)]) == pytest.approx(math.log(2.0))
    assert log_rms([torch.zeros(5)]) == pytest.approx(math.log(1e-30))  # measurable, far below anything honest
    assert log_rms([torch.tensor([1.0, float("nan")])]) is None
    assert log_rms([torch.tensor([1.0, float("-inf")])]) is None
    assert log_rms([torch.full((4,), 1e30)]) == math.inf  # finite, too large to square
    assert log_rms([torch.full((2,), 300.0, dtype=torch.float16)]) == pytest.approx(math.log(300.0), rel=1e-3)
    assert math.isnan(log_rms([torch.ones(0), torch.ones(3, dtype=torch.int64)]))  # nothing to measure


def test_the_range_is_enforced_after_the_warm_up_and_refuses_zeros_and_times_ten():
    ranges = RangeTracker(CONFIG)
    for i in range(CONFIG.warmup - 1):
        assert ranges.plausible("e", math.log(10.0))  # warming up: anything goes
        ranges.add("e", log_rms(honest(seed=i)))
    assert ranges.bounds("e") is None
    ranges.add("e", log_rms(honest(seed=99)))
    low, high = ranges.bounds("e")
    assert low < 0.0 < high
    assert ranges.plausible("e", log_rms(honest(batch=1, seed=5)))  # a one-sample call's noise
    assert ranges.plausible("e", log_rms(honest(scale=1.5, seed=6)))
    assert not ranges.plausible("e", log_rms([10 * t for t in honest(seed=7)]))
    assert not ranges.plausible("e", log_rms([0 * t for t in honest(seed=8)]))
    assert ranges.bounds("other") is None and ranges.plausible("other", 50.0)  # per expert


def test_a_minority_of_liars_in_the_warm_up_cannot_move_the_range():
    ranges = RangeTracker(CONFIG)
    for i in range(CONFIG.warmup):
        outputs = honest(seed=i)
        ranges.add("e", log_rms([10 * t for t in outputs] if i % 4 == 0 else outputs))  # a quarter lie x10
    assert ranges.plausible("e", log_rms(honest(seed=100)))
    assert not ranges.plausible("e", log_rms([10 * t for t in honest(seed=101)]))


def test_the_range_follows_a_scale_that_drifts_slowly():
    ranges = RangeTracker(CONFIG)
    scale = 1.0
    for i in range(400):
        outputs = honest(seed=i, scale=scale)
        assert ranges.plausible("e", log_rms(outputs))
        ranges.add("e", log_rms(outputs))
        scale *= 1.01  # x50 over the run
    assert not ranges.plausible("e", log_rms(honest(seed=1)))  # where it started is now implausible


def test_a_non_finite_reply_excludes_its_host_at_once():
    ledger = TrustLedger()
    guard = ReplyGuard(ledger, CONFIG)
    with pytest.raises(NonFiniteReplyError, match="non-finite outputs of expert e.0") as caught:
        guard.check_outputs("e.0", "liar", [torch.tensor([[1.0, float("nan")]])])
    assert caught.value.excluded and caught.value.outputs is None
    assert ledger.standing("e.1", "liar") is Standing.EXCLUDED
    assert "non-finite" in ledger.exclusion_reason("liar")


def test_implausible_replies_fail_count_and_exclude_after_the_policys_strikes():
    ledger = TrustLedger(TrustPolicy(guard_strikes=3))
    guard = ReplyGuard(ledger, CONFIG)
    for i in range(CONFIG.warmup):
        guard.check_outputs("e.0", "honest", honest(seed=i))
    lie = [10 * t for t in honest(seed=50)]
    for attempt in range(2):
        with pytest.raises(ImplausibleReplyError, match="outside the plausible") as caught:
            guard.check_outputs("e.0", "liar", lie)
        assert not caught.value.excluded and caught.value.outputs[0] is lie[0]  # kept for an audit
    guard.check_outputs("e.0", "liar", honest(seed=51))  # an accepted reply: the count starts over
    for attempt in range(3):
        with pytest.raises(ImplausibleReplyError) as caught:
            guard.check_outputs("e.0", "liar", lie)
    assert caught.value.excluded and ledger.excluded("liar")
    assert "3 replies in a row out of range" in ledger.exclusion_reason("liar")
    report = ledger.report()
    assert report["liar"]["replies_rejected"] == 5 and report["liar"]["replies"] == 6
    assert report["honest"]["replies_rejected"] == 0


def test_a_host_lying_only_in_input_gradients_is_excluded_though_its_forwards_pass():
    ledger = TrustLedger(TrustPolicy(guard_strikes=3))
    guard = ReplyGuard(ledger, CONFIG)
    sent = honest(seed=99)
    for i in range(CONFIG.warmup):
        guard.check_outputs("e.0", "honest", honest(seed=i))
        guard.check_gradients("e.0", "honest", honest(seed=100 + i), sent)
    for attempt in range(3):
        guard.check_outputs("e.0", "liar", honest(seed=200 + attempt))  # its forwards are honest
        with pytest.raises(ImplausibleReplyError) as caught:
            guard.check_gradients("e.0", "liar", [10 * t for t in honest(seed=300 + attempt)], sent)
    assert caught.value.excluded and ledger.excluded("liar")
    assert "input gradients" in ledger.exclusion_reason("liar")


def test_an_all_zero_input_may_get_an_all_zero_output():
    ledger = TrustLedger()
    guard = ReplyGuard(ledger, CONFIG)
    for i in range(CONFIG.warmup):
        guard.check_outputs("e.0", "honest", honest(seed=i), honest(seed=100 + i))
    guard.check_outputs("e.0", "honest", [torch.zeros(8, 16)], [torch.zeros(8, 16)])  # f(0) = 0: no lie
    with pytest.raises(ImplausibleReplyError):
        guard.check_outputs("e.0", "honest", [torch.zeros(8, 16)], honest(seed=7))
    assert ledger.report()["honest"]["replies_rejected"] == 1


def test_input_gradients_are_judged_by_the_experts_gain_so_a_shrinking_loss_is_no_lie():
    ledger = TrustLedger()
    guard = ReplyGuard(ledger, CONFIG)
    weight = torch.randn(16, 16) / 4
    for i in range(200):
        grad_out = honest(seed=i, scale=0.97 ** i)  # the loss shrinks: gradients fall x400
        guard.check_gradients("e.0", "honest", [grad_out[0] @ weight], grad_out)
    grad_out = honest(seed=999, scale=1e-3)
    with pytest.raises(ImplausibleReplyError, match="input gradients"):
        guard.check_gradients("e.0", "liar", [100 * (grad_out[0] @ weight)], grad_out)
    with pytest.raises(NonFiniteReplyError):
        guard.check_gradients("e.0", "liar2", [torch.full((8, 16), float("inf"))], grad_out)
    # zero output gradients: no gain to measure, only finiteness
    guard.check_gradients("e.0", "honest", [torch.zeros(8, 16)], [torch.zeros(8, 16)])
    assert not ledger.excluded("honest")


@pytest.mark.parametrize("bad", [{"warmup": 0}, {"spread": -1.0}, {"window": 4, "warmup": 8}, {"min_band": True}])
def test_config_refuses_nonsense(bad):
    with pytest.raises(ExpertConfigError):
        GuardConfig(**bad)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-50, max_value=50), min_size=16, max_size=80), st.floats(min_value=-60, max_value=60))
def test_every_range_contains_its_median_and_is_at_least_the_minimum_band_wide(values, probe):
    ranges = RangeTracker(GuardConfig(warmup=16, window=64, refresh_every=1))
    for value in values:
        ranges.add("e", value)
    low, high = ranges.bounds("e")
    assert high - low >= 2 * CONFIG.min_band - 1e-9
    window = sorted(values[-CONFIG.window:])
    assert low <= window[len(window) // 2] <= high
    assert ranges.plausible("e", probe) == (low <= probe <= high)


def test_the_guards_median_is_statistics_median():
    import random
    import statistics

    from volunteer.experts.guard import _median

    rng = random.Random(3)
    for size in (1, 2, 3, 16, 255, 256):
        values = [rng.gauss(0, 1) for _ in range(size)]
        assert _median(sorted(values)) == statistics.median(values)
