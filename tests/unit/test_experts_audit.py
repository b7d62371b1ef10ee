"""The pure half of audits (volunteer/experts/audit.py): how far apart two replies are, how far
replicas may drift apart, and what a third opinion decides."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from volunteer.errors import ExpertConfigError
from volunteer.experts.audit import AuditConfig, Gap, Outcome, distance, judge, tolerance

CONFIG = AuditConfig()


def test_distance_of_the_lies_a_trainer_must_catch():
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
    assert fresh == pytest.approx(CONFIG.hardware_tolerance + CONFIG.drift_floor)
    assert tolerance(CONFIG, 1.0, 1.0) > fresh
    capped = CONFIG.hardware_tolerance + CONFIG.max_tolerance
    assert tolerance(CONFIG, 20.0, 30.0) == pytest.approx(capped)
    assert capped < 0.9  # a x10 or a zero reply never passes
    assert tolerance(CONFIG, 1.0, 1.0, "blockwise8_64") > tolerance(CONFIG, 1.0, 1.0)  # compression adds error


@pytest.mark.parametrize("ages", [(None, 1.0), (1.0, None), (None, None), (40.0, 30.0), (math.inf, 0.0)])
def test_replicas_that_never_synced_or_not_lately_are_not_compared(ages):
    assert tolerance(CONFIG, *ages) is None


def test_judge():
    agree, differ = Gap(0.1, 0.5), Gap(0.9, 0.5)
    assert judge(agree) is Outcome.AGREE
    assert judge(differ) is Outcome.UNDECIDED  # no third opinion
    assert judge(differ, differ, agree) is Outcome.FIRST_WRONG  # the third sides with the second
    assert judge(differ, agree, differ) is Outcome.SECOND_WRONG
    assert judge(differ, agree, agree) is Outcome.UNDECIDED  # close to both: cannot tell
    assert judge(differ, differ, differ) is Outcome.UNDECIDED  # far from both: cannot tell either


@pytest.mark.parametrize("bad", [{"drift_floor": -0.1}, {"max_pending": 0}, {"max_tolerance": float("nan")},
                                 {"heartbeat_slack": True}])
def test_config_refuses_nonsense(bad):
    with pytest.raises(ExpertConfigError):
        AuditConfig(**bad)


floats = hnp.arrays("float32", st.tuples(st.integers(1, 4), st.integers(1, 5)),
                    elements=st.floats(-1e6, 1e6, width=32, allow_nan=False))


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
    from volunteer.experts.audit import lossier

    assert lossier("float16", "blockwise8_64") == "blockwise8_64"
    assert lossier("none", "float16") == "float16"
    assert lossier(None, "float16") == "float16" and lossier("none", None) == "none"
    # a x3 reply (relative gap 0.67) is beyond the widest drift over float16, not over auto's worst case
    config = AuditConfig()
    assert tolerance(config, 30.0, 30.0, "float16") < 2 / 3 < tolerance(config, 30.0, 30.0, "blockwise8_256")
