"""The pure half of audits (volunteer/experts/comparison.py): how far apart two replies are, how far
replicas may drift apart, and what a third opinion decides."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from volunteer.errors import ExpertConfigError
from volunteer.experts.comparison import (
    AuditConfig, Difference, Gap, Outcome, Tolerance, compare, judge, loose_tolerance, tolerance,
)
from volunteer.experts.distance import distance

CONFIG = AuditConfig()


def test_compare_splits_a_difference_into_direction_and_scale():
    out = [torch.randn(32, 64, generator=torch.Generator().manual_seed(0))]
    other = [torch.randn(32, 64, generator=torch.Generator().manual_seed(1))]
    assert compare(out, out) == Difference(0.0, 1.0)
    assert compare(out, [10 * out[0]]).scale == pytest.approx(10.0)  # x10: same direction, ten times the norm
    assert compare(out, [10 * out[0]]).direction == pytest.approx(0.0, abs=1e-5)
    assert compare([10 * out[0]], out) == compare(out, [10 * out[0]])  # symmetric
    zero = compare(out, [torch.zeros_like(out[0])])
    assert zero.scale == math.inf and zero.direction == pytest.approx(1.0)
    assert compare(out, [-out[0]]).direction == pytest.approx(2.0)  # negated
    assert compare(out, other).direction == pytest.approx(math.sqrt(2), abs=0.05)  # made up: unrelated
    assert compare(out, [1.03 * out[0]]).scale == pytest.approx(1.03)  # the subtle lie
    assert compare([torch.zeros(3)], [torch.zeros(3)]) == Difference(0.0, 1.0)
    for bad in ([out[0][:, :8]], [*out, *out], [out[0] * float("nan")]):
        assert compare(out, bad) == Difference(math.inf, math.inf)


def test_honest_drift_passes_where_lies_do_not():
    # a replica that trained apart: its replies turned (direction 0.8, more than the largest honest
    # drift measured) and kept their scale, as a LayerNorm'd expert's do
    generator = torch.Generator().manual_seed(2)
    out = torch.randn(32, 64, generator=generator)
    noise = torch.randn(32, 64, generator=generator)
    noise -= (noise * out).sum() / (out * out).sum() * out  # orthogonal to out
    angle = 2 * math.asin(0.8 / 2)  # the chord between the unit replies is 0.8
    drifted = math.cos(angle) * out + math.sin(angle) * out.norm() / noise.norm() * noise
    allowed = tolerance(CONFIG, 10.0, 10.0, "float16")
    honest = Gap(compare([out], [drifted]), allowed)
    assert 0.75 < honest.difference.direction < 0.85 and honest.agree
    assert Gap(compare([out], [1.4 * drifted]), allowed).agree  # input gradients' scale drifts too
    for lie in (3 * out, 10 * drifted, torch.zeros_like(out), -out, torch.randn(32, 64, generator=generator)):
        assert not Gap(compare([out], [lie]), allowed).agree


def test_distance_of_parameters():
    out = [torch.randn(32, 64, generator=torch.Generator().manual_seed(0))]
    assert distance(out, out) == 0.0
    assert distance(out, [torch.zeros_like(out[0])]) == pytest.approx(1.0)
    assert distance(out, [10 * out[0]]) == pytest.approx(0.9)
    assert distance([10 * out[0]], out) == pytest.approx(0.9)  # symmetric
    assert distance(out, [1.03 * out[0]]) == pytest.approx(0.03 / 1.03)  # the subtle lie: under honest drift
    assert distance([torch.zeros(3)], [torch.zeros(3)]) == 0.0
    assert distance(out, [out[0][:, :8]]) == math.inf and distance(out, [*out, *out]) == math.inf
    assert distance(out, [out[0] * float("nan")]) == math.inf


def test_tolerance_grows_with_the_replicas_sync_ages_and_is_capped():
    fresh = tolerance(CONFIG, 0.0, 0.0)
    assert fresh.direction == pytest.approx(CONFIG.hardware_tolerance + CONFIG.drift_floor)
    assert fresh.scale == pytest.approx(CONFIG.max_scale * (1 + CONFIG.hardware_tolerance))
    assert tolerance(CONFIG, 1.0, 1.0).direction > fresh.direction
    capped = tolerance(CONFIG, 20.0, 30.0)
    assert capped.direction == pytest.approx(CONFIG.hardware_tolerance + CONFIG.max_tolerance)
    assert capped.direction < math.sqrt(2) - 0.3  # a made-up reply never passes
    assert capped.scale < 2.5  # nor a x3, x10 or zero one
    worse = tolerance(CONFIG, 1.0, 1.0, "blockwise8_64")  # compression adds error
    assert worse.direction > tolerance(CONFIG, 1.0, 1.0).direction and worse.scale > tolerance(CONFIG, 1.0, 1.0).scale


def test_a_host_claiming_no_recent_sync_is_compared_at_the_widest_tolerance():
    widest = tolerance(CONFIG, 20.0, 30.0)
    assert loose_tolerance(CONFIG, None, 1.0) == widest == loose_tolerance(CONFIG, 1.0, 45.0)
    assert loose_tolerance(CONFIG, 1.0, 1.0) is None and loose_tolerance(CONFIG, None, None) is None


@pytest.mark.parametrize("ages", [(None, 1.0), (1.0, None), (None, None), (40.0, 30.0), (math.inf, 0.0)])
def test_replicas_that_never_synced_or_not_lately_are_not_compared(ages):
    assert tolerance(CONFIG, *ages) is None


def test_judge():
    allowed = Tolerance(0.5, 2.0)
    agree, differ = Gap(Difference(0.1, 1.1), allowed), Gap(Difference(0.9, 1.0), allowed)
    assert not Gap(Difference(0.1, 3.0), allowed).agree  # either part beyond its tolerance disagrees
    assert judge(agree) is Outcome.AGREE
    assert judge(differ) is Outcome.UNDECIDED  # no third opinion
    assert judge(differ, differ, agree) is Outcome.FIRST_WRONG  # the third sides with the second
    assert judge(differ, agree, differ) is Outcome.SECOND_WRONG
    assert judge(differ, agree, agree) is Outcome.UNDECIDED  # close to both: cannot tell
    assert judge(differ, differ, differ) is Outcome.UNDECIDED  # far from both: cannot tell either


@pytest.mark.parametrize("bad", [{"drift_floor": -0.1}, {"max_pending": 0}, {"max_tolerance": float("nan")},
                                 {"heartbeat_slack": True}, {"max_scale": 0.5}])
def test_config_refuses_nonsense(bad):
    with pytest.raises(ExpertConfigError):
        AuditConfig(**bad)


floats = hnp.arrays("float32", st.tuples(st.integers(1, 4), st.integers(1, 5)),
                    elements=st.floats(-1e6, 1e6, width=32, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(floats, floats)
def test_compare_is_symmetric_and_bounded(a, b):
    first, second = [torch.from_numpy(a)], [torch.from_numpy(b)]
    difference = compare(first, second)
    assert difference == compare(second, first)
    if a.shape != b.shape:
        assert difference == Difference(math.inf, math.inf)
    else:
        assert 0.0 <= difference.direction <= 2.0 + 1e-6 and difference.scale >= 1.0
        assert compare(first, first).direction <= 1e-6 and compare(first, first).scale == 1.0


@settings(max_examples=200, deadline=None)
@given(floats, floats)
def test_distance_is_symmetric_and_between_zero_and_two(a, b):
    first, second = [torch.from_numpy(a)], [torch.from_numpy(b)]
    d = distance(first, second)
    assert d == distance(second, first)
    if a.shape != b.shape:
        assert d == math.inf
    else:
        assert 0.0 <= d <= 2.0 + 1e-6
        assert distance(first, first) == 0.0


def test_replies_are_compared_within_the_error_of_the_lossier_encoding_they_travelled_in():
    from volunteer.experts.comparison import lossier

    assert lossier("float16", "blockwise8_64") == "blockwise8_64"
    assert lossier("none", "float16") == "float16"
    assert lossier(None, "float16") == "float16" and lossier("none", None) == "none"
    # a x3 reply is beyond the widest drift even over auto's lossiest encoding (its relative L2 gap
    # of 0.67 was not, once 8-bit's error was allowed for)
    config = AuditConfig()
    assert tolerance(config, 30.0, 30.0, "float16").scale < tolerance(config, 30.0, 30.0, "blockwise8_256").scale < 3
