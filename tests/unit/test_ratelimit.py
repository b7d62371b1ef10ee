"""The one rate limiter: token buckets per key, pure, bounded in keys."""

import pytest

from volunteer.net.ratelimit import RateLimiter


def test_burst_then_refill_at_rate():
    limiter = RateLimiter(rate=2.0, burst=3)
    assert [limiter.allow("a", now=0.0) for _ in range(4)] == [True, True, True, False]
    assert not limiter.allow("a", now=0.4)  # 0.8 tokens
    assert limiter.allow("a", now=0.5)  # 1.0 token
    assert limiter.allow("b", now=0.5)  # keys are independent


def test_cost_and_delay():
    limiter = RateLimiter(rate=10.0, burst=100)
    assert limiter.allow("k", now=0.0, cost=60)
    assert not limiter.allow("k", now=0.0, cost=60)  # refused: nothing taken
    assert limiter.delay("k", now=0.0, cost=60) == pytest.approx(2.0)
    limiter.spend("k", now=0.0, cost=500)  # a debt: paid by waiting
    assert limiter.delay("k", now=0.0, cost=1) == pytest.approx(46.1)


def test_keys_are_bounded_least_recent_forgotten():
    limiter = RateLimiter(rate=0.0, burst=1, max_keys=2)
    assert limiter.allow("honest", now=0.0)
    for i in range(100):
        limiter.allow(f"minted-{i}", now=1.0 + i)
        assert len(limiter) <= 2
    # the flooder's fresh keys pushed "honest" out; it starts again with a full bucket
    assert limiter.allow("honest", now=200.0)


def test_rejects_nonsense_parameters():
    with pytest.raises(ValueError):
        RateLimiter(rate=1.0, burst=0)
    with pytest.raises(ValueError):
        RateLimiter(rate=1.0, burst=1, max_keys=0)
