"""Admission bookkeeping of the expert server: request-byte budgets and backward authorization
(pure: ``now`` is passed in)."""

from __future__ import annotations

import pytest

from volunteer.errors import ExpertConfigError
from volunteer.experts import ExpertsConfig
from volunteer.experts.admission import PEER_BYTES, TOTAL_BYTES, ForwardRecord, RequestBudget

CONFIG = ExpertsConfig(max_payload_bytes=100, max_request_bytes_per_peer=200, max_request_bytes_total=300)


def test_budget_refuses_past_the_peer_share_then_past_the_total_and_reserves_nothing_then():
    budget = RequestBudget(CONFIG)
    assert budget.reserve("a", 100) is None and budget.reserve("a", 100) is None
    assert budget.reserve("a", 1) == PEER_BYTES
    assert budget.reserve("b", 100) is None
    assert budget.reserve("c", 100) == TOTAL_BYTES
    assert budget.total == 300 and budget.held_by("a") == 200 and budget.held_by("c") == 0
    budget.release("a", 100)
    assert budget.reserve("c", 100) is None
    for peer, nbytes in (("a", 100), ("b", 100), ("c", 100)):
        budget.release(peer, nbytes)
    assert budget.total == 0 and budget._by_peer == {}  # idle peers leave no entries behind


def test_forward_record_window_and_bounded_lru():
    config = ExpertsConfig(backward_window=100.0, max_forward_records=2)
    record = ForwardRecord(config)
    assert not record.may_backward("a", "e.0", now=0.0)
    record.forwarded("a", "e.0", now=0.0)
    assert record.may_backward("a", "e.0", now=100.0)
    assert not record.may_backward("a", "e.1", now=1.0) and not record.may_backward("b", "e.0", now=1.0)
    assert not record.may_backward("a", "e.0", now=100.5)  # the window passed: forgotten
    assert len(record) == 0
    record.forwarded("a", "e.0", now=200.0)
    record.forwarded("b", "e.0", now=201.0)
    record.forwarded("a", "e.0", now=202.0)  # refreshed: now the most recent
    record.forwarded("c", "e.0", now=203.0)  # over capacity: b, least recently used, goes
    assert len(record) == 2
    assert record.may_backward("a", "e.0", now=210.0) and record.may_backward("c", "e.0", now=210.0)
    assert not record.may_backward("b", "e.0", now=210.0)


@pytest.mark.parametrize(
    "fields",
    [
        {"backward_window": 89.0},  # shorter than a trainer's forward (30 s) plus backward (60 s)
        {"max_request_bytes_per_peer": 10, "max_payload_bytes": 20, "max_request_bytes_total": 30},
        {"max_request_bytes_per_peer": 40, "max_payload_bytes": 20, "max_request_bytes_total": 30},
        {"max_forward_records": 0},
        {"share_tracebacks": "some"},
    ],
)
def test_config_refuses_inconsistent_admission_bounds(fields):
    with pytest.raises(ExpertConfigError):
        ExpertsConfig(**fields)
