"""Perf accounting and size parsing (pure)."""

import pytest

from volunteer.net.perf import ByteBudget
from volunteer.sizes import format_size, parse_size


def test_parse_size():
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1GB") == 10**9
    assert parse_size("512k") == 512_000
    assert parse_size("100") == 100
    assert parse_size("1.5KiB") == 1536
    for bad in ("", "MiB", "-1", "12XB", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(64 << 20) == "64.0 MiB"


def test_byte_budget_slides():
    budget = ByteBudget(limit=100, window=60.0)
    assert budget.try_spend(60, now=0.0)
    assert not budget.try_spend(50, now=10.0)  # 110 > 100 within the window
    assert budget.try_spend(40, now=10.0)
    assert budget.used(59.9) == 100
    assert budget.used(60.0) == 40  # the first spend left the window
    assert budget.try_spend(60, now=60.5)
    assert budget.used(70.1) == 60
