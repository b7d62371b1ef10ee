"""What exact audits at the trusted floor may cost (``AuditConfig.cost_share``): over a slow uplink
one snapshot takes seconds, so the floor's audits thin out to what their share of the trainer's
time pays for, while the audits that earn or question a standing (a fresh peer's, an unproven
pair's, a suspect's) run whatever they cost. Trio's MockClock stands in for the time."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import trio

from volunteer.errors import ExpertError
from volunteer.experts.audit import AuditBudget, Auditor
from volunteer.experts.comparison import AuditConfig
from volunteer.experts.trust import TrustLedger

UID, PEER = "ffn.0.0", "12D3KooWHost"
X = torch.ones(2, 4)


class AlwaysDraw(random.Random):
    """Every call's audit draw says "audit": what is left to decide is the budget's."""

    def random(self) -> float:
        return 0.0


def test_the_bucket_fills_at_its_share_of_the_time_and_never_past_its_burst():
    budget = AuditBudget(share=0.05, burst=10.0)
    assert budget.allows(0.0) and budget.balance == 10.0
    budget.spend(26.0, 0.0)  # one 32 MB snapshot over 10 Mbit/s
    assert budget.balance == -10.0 and not budget.allows(0.0)  # debt no deeper than the burst
    assert not budget.allows(199.0)  # 199 s at 5 % pay back 9.95 s
    assert budget.allows(200.0)
    assert budget.allows(10_000.0) and budget.balance == 10.0
    budget.spend(-1.0, 10_000.0)  # a clock that went nowhere costs nothing
    assert budget.balance == 10.0
    assert budget.allows(5_000.0) and budget.balance == 10.0  # an older time fills nothing


def trusted_ledger() -> TrustLedger:
    ledger = TrustLedger()
    for _ in range(ledger.policy.trust_after):
        ledger.passed(UID, PEER, exact=True)
    return ledger


def test_only_a_trusted_proven_pair_is_at_the_floor():
    ledger = TrustLedger()
    assert not ledger.at_floor(UID, PEER)  # never seen
    ledger.passed(UID, PEER, exact=True)
    assert not ledger.at_floor(UID, PEER)  # fresh
    for _ in range(ledger.policy.trust_after):
        ledger.passed(UID, PEER, exact=True)
    assert ledger.at_floor(UID, PEER)
    assert not ledger.at_floor("ffn.0.1", PEER)  # a pair it has not proven
    ledger.disagreed(UID, PEER)
    assert not ledger.at_floor(UID, PEER)  # suspect
    other = trusted_ledger()
    other.exclude(PEER, "a proof")
    assert not other.at_floor(UID, PEER)


def auditor(ledger: TrustLedger, fetch=None, **config) -> tuple[Auditor, dict, list]:
    stats: dict[str, int] = {}

    async def no_fetch(peer, uid, state):
        raise AssertionError("not fetched in this test")

    audits = Auditor(ledger, lambda uid: [], lambda uid, host, follows: None, stats,
                     config=AuditConfig(**config), rng=AlwaysDraw(), fetch_snapshot=fetch or no_fetch)
    return audits, stats, []


def call() -> SimpleNamespace:
    return SimpleNamespace(uid=UID, peer=PEER, backward_follows=False)


async def test_floor_audits_wait_while_the_budget_is_in_debt_and_resume_as_it_fills(autojump_clock):
    audits, stats, started = auditor(trusted_ledger(), cost_share=0.05, cost_burst=2.0)
    audits._start = lambda fn, *args: started.append(args) or True  # what would have run
    receipt = object()
    assert audits.answered(call(), X, [X], receipt=receipt) is not None
    audits.budget.spend(4.0, trio.current_time())  # that audit's snapshot took 4 s to come
    for _ in range(10):
        assert audits.answered(call(), X, [X], receipt=receipt) is None
    assert stats["audits_deferred"] == 10 and len(started) == 1
    await trio.sleep(39.0)  # 39 s at 5 % pay back 1.95 s of the 2 s debt
    assert audits.answered(call(), X, [X], receipt=receipt) is None
    await trio.sleep(1.0)
    assert audits.answered(call(), X, [X], receipt=receipt) is not None
    assert stats["audits_deferred"] == 11 and len(started) == 2


async def test_a_fresh_or_unproven_host_is_audited_whatever_the_budget_says(autojump_clock):
    ledger = TrustLedger()
    audits, stats, started = auditor(ledger, cost_share=0.05, cost_burst=1.0)
    audits._start = lambda fn, *args: started.append(args) or True
    audits.budget.spend(100.0, trio.current_time())
    for _ in range(ledger.policy.prove_after + 5):
        assert audits.answered(call(), X, [X], receipt=object()) is not None  # every one: fresh, then unproven
        ledger.passed(UID, PEER, exact=True)
    assert stats["audits_deferred"] == 0


async def test_an_audit_spends_what_its_snapshot_took(autojump_clock):
    async def slow_and_gone(peer, uid, state):
        await trio.sleep(3.0)
        raise ExpertError("forgotten")

    audits, stats, _ = auditor(trusted_ledger(), fetch=slow_and_gone, cost_share=0.05, cost_burst=10.0)
    receipt = SimpleNamespace(state=b"s", version=1)
    assert await audits._recompute(UID, PEER, receipt, [X], [X], "outputs") is None
    assert audits.budget.balance == pytest.approx(10.0 - 3.0)
    assert stats["snapshots_missing"] == 1
