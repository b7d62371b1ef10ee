"""The Auditor driver (volunteer/experts/audit.py) on trio with scripted replicas instead of a
network: who gets asked, what a disagreement and a third opinion do to the trust ledger, how the
backward of an audited call is mirrored, and what is counted."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest
import torch
import trio
import trio.testing

from volunteer.errors import ExpertTimeoutError, ImplausibleReplyError, NonFiniteReplyError
from volunteer.experts.audit import Auditor
from volunteer.experts.comparison import AuditConfig
from volunteer.experts.trust import Standing, TrustLedger, TrustPolicy

UID = "e.0"
X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
TRUTH = torch.tanh(X)
ALWAYS = TrustPolicy(untrusted_rate=1.0, suspect_rate=1.0, audit_rate=1.0)


@dataclass(frozen=True)
class Host:
    peer: str
    addrs: tuple = ()


def turned(reply: torch.Tensor, chord: float) -> torch.Tensor:
    """``reply`` turned away from itself, its norm kept: the unit vectors of the two are ``chord``
    apart (what a replica that trained apart does to its replies; 1.41: an unrelated reply)."""
    if chord == 0.0:
        return reply
    other = torch.randn(reply.shape, generator=torch.Generator().manual_seed(7))
    other -= (other * reply).sum() / (reply * reply).sum() * reply
    angle = 2 * math.asin(chord / 2)
    return math.cos(angle) * reply + math.sin(angle) * reply.norm() / other.norm() * other


class Replica:
    """A scripted host: answers ``factor`` times the truth, ``turn``ed (or raises ``error``)."""

    def __init__(self, name: str, factor: float = 1.0, error: Exception | None = None, grad_factor: float = 1.0,
                 turn: float = 0.0) -> None:
        self.host, self.factor, self.error, self.grad_factor, self.turn = Host(name), factor, error, grad_factor, turn
        self.forwards: list[bool] = []  # backward_follows of each forward it got
        self.backwards = 0

    def reply(self, inputs: torch.Tensor) -> torch.Tensor:
        return turned(torch.tanh(inputs) * self.factor, self.turn)


class Call:
    def __init__(self, replica: Replica, backward_follows: bool, uid: str = UID) -> None:
        self.replica, self.backward_follows = replica, backward_follows
        self.uid, self.peer = uid, replica.host.peer

    async def forward(self, inputs, report=None):
        self.replica.forwards.append(self.backward_follows)
        await trio.sleep(0)
        if self.replica.error is not None:
            raise self.replica.error
        return [self.replica.reply(inputs[0])]

    async def backward(self, inputs, grads, kept=None, report=None):
        self.replica.backwards += 1
        await trio.sleep(0)
        return [grads[0] * self.replica.grad_factor]


def auditor(replicas: list[Replica], *, ages: float | None | dict = 1.0, policy: TrustPolicy = ALWAYS, **config):
    """``ages``: every replica's declared sync age, or a dict of them by name (1 s if missing)."""
    ledger = TrustLedger(policy)
    stats: dict[str, int] = {}
    by_peer = {r.host.peer: r for r in replicas}
    age_of = (lambda peer: ages.get(peer, 1.0)) if isinstance(ages, dict) else (lambda peer: ages)
    audits = Auditor(ledger, lambda uid: [(r.host, age_of(r.host.peer)) for r in replicas if not ledger.excluded(r.host.peer)],
                     lambda uid, host, follows: Call(by_peer[host.peer], follows, uid), stats,
                     config=AuditConfig(**config), rng=random.Random(0))
    return audits, ledger, stats


async def settle(audits: Auditor) -> None:
    while audits.pending:
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0)


async def answer(audits: Auditor, replica: Replica, *, follows: bool = False, outputs=None, uid: str = UID):
    return audits.answered(Call(replica, follows, uid), X, outputs if outputs is not None else [replica.reply(X)])


async def test_agreeing_replicas_are_both_proven():
    a, b = Replica("a"), Replica("b")
    audits, ledger, stats = auditor([a, b])
    await answer(audits, a)
    await settle(audits)
    assert b.forwards == [False] and stats["audits"] == 1 and stats["disagreements"] == 0
    assert ledger.standing(UID, "a") is Standing.PROVEN and ledger.standing(UID, "b") is Standing.PROVEN


async def test_a_disagreement_is_settled_by_a_third_replica_and_a_peer_outvoted_on_two_experts_is_excluded():
    liar, b, c = Replica("liar", factor=3.0), Replica("b"), Replica("c")
    audits, ledger, stats = auditor([liar, b, c])
    await answer(audits, liar)
    await settle(audits)
    assert stats["disagreements"] == 1 and stats["outvoted"] == 1 and stats["exclusions"] == 0
    # outvoted once: not called for this expert again, but not yet a verdict on the peer (honest
    # replicas of a fast-training expert drift off one expert at a time)
    assert ledger.standing(UID, "liar") is Standing.OUTVOTED and ledger.pick_weight(UID, "liar") == 0.0
    assert not ledger.excluded("liar") and ledger.pick_weight("e.1", "liar") > 0
    assert ledger.standing(UID, "b") is Standing.PROVEN and ledger.standing(UID, "c") is Standing.PROVEN
    assert b.forwards == [False] and c.forwards == [False]  # an audit of an evaluation call, then a lone forward
    await answer(audits, liar, uid="e.1")  # a liar lies on every expert it serves
    await settle(audits)
    assert stats["outvoted"] == 2 and stats["exclusions"] == 1 and ledger.excluded("liar")
    assert ledger.exclusion_reason("liar").startswith("its outputs of expert e.1 differed from those of")
    assert ledger.exclusion_reason("liar").endswith("outvoted before on e.0")


async def test_a_replica_that_drifted_off_is_not_outvoted_but_a_made_up_reply_at_the_same_scale_is():
    # a lagging honest replica's replies turned by 0.77 on a loaded machine, on two experts in one
    # run, at the same scale; a made-up reply (noise at the honest scale) is unrelated: 1.41
    drifted, liar, b, c = Replica("drifted", turn=0.8), Replica("liar", turn=math.sqrt(2)), Replica("b"), Replica("c")
    ages = 8.0  # each: a sync a few seconds ago, plus the slack for its declaration's age
    audits, ledger, stats = auditor([drifted, b, c], ages=ages)
    for uid in ("e.0", "e.1"):
        await answer(audits, drifted, uid=uid)
        await settle(audits)
    assert stats["audits"] == 2 and stats["disagreements"] == 0 and not ledger.excluded("drifted")
    audits, ledger, stats = auditor([liar, b, c], ages=ages)
    for uid in ("e.0", "e.1"):
        await answer(audits, liar, uid=uid)
        await settle(audits)
    assert stats["disagreements"] == 2 and ledger.excluded("liar")


async def test_with_no_third_replica_both_stay_suspect():
    liar, b = Replica("liar", factor=3.0), Replica("b")
    audits, ledger, stats = auditor([liar, b])
    await answer(audits, b)
    await settle(audits)
    assert stats["disagreements"] == 1 and stats["exclusions"] == 0
    assert ledger.standing(UID, "liar") is Standing.SUSPECT and ledger.standing(UID, "b") is Standing.SUSPECT


async def test_replicas_that_never_synced_are_not_compared():
    a, b = Replica("a"), Replica("b", factor=5.0)
    audits, ledger, stats = auditor([a, b], ages=None)
    await answer(audits, a)
    await settle(audits)
    assert b.forwards == [] and stats["unauditable"] == 1 and stats["audits"] == 0
    assert ledger.standing(UID, "a") is Standing.UNPROVEN


@pytest.mark.parametrize("claim", [None, 65.0])  # no sync at all, or one too old to compare strictly
async def test_a_host_that_claims_no_recent_sync_is_still_compared_and_outvoted_it_is_stale(claim):
    # declaring no sync age does not buy freedom from audits: a gross lie is compared loosely with
    # replicas that claim a sync, and once two of them outvote it, it is not called for the expert
    liar, b, c = Replica("liar", factor=10.0), Replica("b"), Replica("c")
    audits, ledger, stats = auditor([liar, b, c], ages={"liar": claim})
    await answer(audits, liar)
    await settle(audits)
    assert stats["audits"] >= 1 and stats["disagreements"] == 1 and stats["stale"] == 1
    assert ledger.standing(UID, "liar") is Standing.STALE and ledger.pick_weight(UID, "liar") == 0.0
    assert not ledger.excluded("liar")  # an honest replica whose rounds keep failing looks the same
    assert b.forwards == [False] and c.forwards == [False]
    ledger.realigned(UID, "liar")  # it declares a recent sync again: audited strictly from now on
    assert ledger.standing(UID, "liar") is Standing.UNPROVEN


async def test_a_loose_comparison_within_the_largest_honest_drift_passes_and_proves_nothing():
    drifted, b = Replica("drifted", factor=1.3), Replica("b")  # a relative gap of 0.23
    audits, ledger, stats = auditor([drifted, b], ages={"drifted": None})
    await answer(audits, drifted)
    await settle(audits)
    assert b.forwards == [False] and stats["audits"] == 1 and stats["disagreements"] == 0
    assert ledger.standing(UID, "drifted") is Standing.UNPROVEN and ledger.standing(UID, "b") is Standing.UNPROVEN


async def test_a_host_that_claims_a_sync_is_never_judged_by_hosts_that_claim_none():
    # hosts that claim no sync may be stale honest ones: they judge nobody (a liar that claims a
    # sync among them gets strict audits wherever an aligned replica exists)
    claims, old_b, old_c = Replica("claims", factor=10.0), Replica("old_b"), Replica("old_c")
    audits, ledger, stats = auditor([claims, old_b, old_c], ages={"old_b": None, "old_c": None})
    await answer(audits, claims)
    await settle(audits)
    assert old_b.forwards == [] and old_c.forwards == [] and stats["unauditable"] == 1
    assert stats["disagreements"] == 0 and ledger.standing(UID, "old_b") is Standing.UNPROVEN


async def test_undecided_a_loose_disagreement_leaves_both_suspect():
    quiet, b = Replica("quiet", factor=10.0), Replica("b")
    audits, ledger, stats = auditor([quiet, b], ages={"quiet": None})
    await answer(audits, quiet)
    await settle(audits)
    assert stats["disagreements"] == 1 and stats["stale"] == 0  # no third replica to outvote either
    assert ledger.standing(UID, "quiet") is Standing.SUSPECT and ledger.standing(UID, "b") is Standing.SUSPECT


async def test_an_audited_training_call_is_mirrored_with_its_backward_and_the_gradients_compared():
    a, b, liar = Replica("a"), Replica("b"), Replica("liar", grad_factor=3.0)
    audits, ledger, stats = auditor([liar, a, b])
    case = await answer(audits, liar, follows=True)
    assert case is not None
    await trio.testing.wait_all_tasks_blocked()
    auditor_replica = a if a.forwards else b
    assert auditor_replica.forwards == [True] and auditor_replica.backwards == 0  # waits for the trainer's backward
    grads = torch.ones_like(TRUTH)
    audits.backward_sent(case, grads, grads * 3.0)  # the trainer's backward to liar went out
    await settle(audits)
    assert auditor_replica.backwards == 1
    assert stats["audits"] == 2 and stats["disagreements"] == 1  # outputs agreed, gradients did not
    assert ledger.standing(UID, "liar") is Standing.OUTVOTED and stats["outvoted"] == 1


async def test_an_audited_call_whose_backward_never_comes_sends_no_backward():
    a, b = Replica("a"), Replica("b")
    audits, _, _ = auditor([a, b])
    case = await answer(audits, a, follows=True)
    await trio.testing.wait_all_tasks_blocked()
    audits.backward_sent(case, None, None)  # the trainer's backward had no gradient for it
    await settle(audits)
    assert b.forwards == [True] and b.backwards == 0


async def test_a_reply_the_guard_rejected_is_compared_with_its_fail_over_at_no_extra_call():
    liar, b, c = Replica("liar", factor=0.0), Replica("b"), Replica("c")
    audits, ledger, stats = auditor([liar, b, c], policy=TrustPolicy(untrusted_rate=0.0, audit_rate=0.0))
    audits.rejected(Call(liar, False), X, ImplausibleReplyError("out of range", outputs=[TRUTH * 0.0]))
    assert await answer(audits, b) is None  # b's fail-over answer: compared, not audited again
    await settle(audits)
    assert b.forwards == [] and c.forwards == [False]  # only the third opinion is a new call
    assert ledger.standing(UID, "liar") is Standing.OUTVOTED and stats["audits"] >= 1


async def test_an_auditor_the_guard_excludes_is_counted_and_one_that_fails_decides_nothing():
    a = Replica("a")
    nan = Replica("nan", error=NonFiniteReplyError("nan", excluded=True))
    audits, ledger, stats = auditor([a, nan])
    await answer(audits, a)
    await settle(audits)
    assert stats["exclusions"] == 1 and stats["audits"] == 0
    slow = Replica("slow", error=ExpertTimeoutError("no answer"))
    audits, ledger, stats = auditor([a, slow])
    await answer(audits, a)
    await settle(audits)
    assert stats["exclusions"] == 0 and ledger.standing(UID, "a") is Standing.UNPROVEN


async def test_audits_in_flight_are_bounded_and_none_start_when_disabled():
    a, b = Replica("a"), Replica("b")
    audits, _, stats = auditor([a, b], max_pending=2)
    for _ in range(5):
        await answer(audits, a, follows=True)  # each waits for a backward that does not come yet
    assert audits.pending == 2 and stats["audits_skipped"] == 3
    audits.enabled = False
    assert await answer(audits, a) is None and audits.pending == 2
