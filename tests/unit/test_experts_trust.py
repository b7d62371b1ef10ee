"""The trust ledger (volunteer/experts/trust.py): standings, BOINC-style streaks, audit
probabilities, pick weights, exclusions and its bounds. Pure: no trio, no torch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import ExpertConfigError
from volunteer.experts.trust import Standing, TrustLedger, TrustPolicy

POLICY = TrustPolicy(audit_rate=0.02, untrusted_rate=0.2, suspect_rate=0.5, trust_after=10, guard_strikes=3)


def prove(ledger: TrustLedger, peer: str, uid: str = "e.proof") -> None:
    """``peer`` passes the audits that end its fresh start (on an expert the test does not look at)."""
    for _ in range(ledger.policy.prove_after):
        ledger.passed(uid, peer)


def test_a_new_identity_is_fresh_every_reply_audited_and_picked_least_until_it_passed_a_few_audits():
    ledger = TrustLedger(POLICY)
    assert ledger.standing("e.0", "a") is Standing.UNPROVEN and ledger.peer_standing("a") is Standing.UNPROVEN
    assert ledger.audit_probability("e.0", "a") == 1.0 and ledger.pick_weight("e.0", "a") == POLICY.fresh_weight
    ledger.replied("a")
    for _ in range(POLICY.prove_after):
        assert ledger.report()["a"]["fresh"] and ledger.audit_probability("e.1", "a") == 1.0
        # proven on an expert after its first audit, yet weighed as fresh until it passed enough
        assert ledger.pick_weight("e.1", "a") == POLICY.fresh_weight
        ledger.passed("e.1", "a")
    assert not ledger.report()["a"]["fresh"] and ledger.pick_weight("e.1", "a") == POLICY.proven_weight
    # past its fresh start, an expert it was not audited on yet is unproven: the usual rate and weight
    assert ledger.audit_probability("e.0", "a") == 0.2 and ledger.pick_weight("e.0", "a") == POLICY.unproven_weight
    assert not ledger.trusted("a") and not ledger.excluded("a")
    # a policy without a fresh start (prove_after 0) weighs a new identity as any unproven host
    bare = TrustLedger(TrustPolicy(prove_after=0))
    assert bare.audit_probability("e.0", "b") == bare.policy.untrusted_rate
    assert bare.pick_weight("e.0", "b") == bare.policy.unproven_weight


def test_a_fresh_identity_caught_is_excluded_as_any_other():
    ledger = TrustLedger(POLICY)
    ledger.disagreed("e.0", "a")  # a fresh suspect: still every reply audited, and picked least
    assert ledger.audit_probability("e.0", "a") == 1.0 and ledger.pick_weight("e.0", "a") == POLICY.fresh_weight
    ledger.exclude("a", "a proof", proof=True)
    assert ledger.audit_probability("e.0", "a") == 0.0 and ledger.pick_weight("e.0", "a") == 0.0
    assert not ledger.report()["a"]["fresh"] and ledger.report()["a"]["excluded_on_proof"]


def test_ten_valid_results_in_a_row_make_a_peer_trusted_then_it_is_rechecked_with_probability_one_over_streak():
    ledger = TrustLedger(POLICY)
    for i in range(9):
        ledger.passed(f"e.{i}", "a")
    assert ledger.standing("e.0", "a") is Standing.PROVEN and ledger.pick_weight("e.0", "a") == POLICY.proven_weight
    assert not ledger.trusted("a") and ledger.audit_probability("e.0", "a") == 0.2  # 9 in a row: not yet
    ledger.passed("e.0", "a")
    assert ledger.trusted("a") and ledger.audit_probability("e.0", "a") == pytest.approx(1 / 10)
    for _ in range(10):
        ledger.passed("e.0", "a")
    assert ledger.audit_probability("e.0", "a") == pytest.approx(1 / 20)
    for _ in range(200):
        ledger.passed("e.0", "a")
    assert ledger.audit_probability("e.0", "a") == 0.02  # never below the floor
    # an expert of a trusted peer that no audit has proven yet is still checked at the higher rate
    assert ledger.audit_probability("e.99", "a") == 0.2


def test_a_disagreement_makes_the_pair_suspect_and_ends_the_streak():
    ledger = TrustLedger(POLICY)
    for _ in range(12):
        ledger.passed("e.0", "a")
    ledger.passed("e.1", "a")
    ledger.disagreed("e.0", "a")
    assert ledger.standing("e.0", "a") is Standing.SUSPECT and ledger.peer_standing("a") is Standing.SUSPECT
    assert ledger.standing("e.1", "a") is Standing.PROVEN
    assert ledger.audit_probability("e.0", "a") == 0.5 and ledger.pick_weight("e.0", "a") == POLICY.suspect_weight
    assert not ledger.trusted("a") and ledger.audit_probability("e.1", "a") == 0.2
    ledger.passed("e.0", "a")  # a later audit passes: proven again
    assert ledger.standing("e.0", "a") is Standing.PROVEN and ledger.peer_standing("a") is Standing.PROVEN


def test_guard_rejections_in_a_row_call_for_exclusion_and_an_accepted_reply_resets_them():
    ledger = TrustLedger(POLICY)
    for _ in range(5):
        ledger.passed("e.0", "a")
    assert ledger.rejected("e.0", "a") is False and ledger.rejected("e.1", "a") is False
    assert ledger.report()["a"]["streak"] == 0  # an invalid result
    ledger.accepted("a")
    assert ledger.rejected("e.0", "a") is False and ledger.rejected("e.0", "a") is False
    assert ledger.rejected("e.1", "a") is True  # the third in a row, over any of its experts


def test_an_excluded_peer_stays_excluded_for_every_expert_with_its_first_reason():
    ledger = TrustLedger(POLICY)
    ledger.passed("e.0", "a")
    ledger.replied("a")
    ledger.replied("a")
    assert ledger.exclude("a", "returned NaN") is True
    assert ledger.exclude("a", "something else") is False
    for uid in ("e.0", "e.7"):
        assert ledger.standing(uid, "a") is Standing.EXCLUDED
        assert ledger.audit_probability(uid, "a") == 0.0 and ledger.pick_weight(uid, "a") == 0.0
    ledger.passed("e.0", "a")  # nothing brings it back
    ledger.disagreed("e.0", "a")
    assert ledger.rejected("e.0", "a") is False
    report = ledger.report()["a"]
    assert report["standing"] == "excluded" and report["excluded_because"] == "returned NaN"
    assert report["excluded_after_replies"] == 2 and report["experts"] == {"e.0": "excluded"}


def test_the_report_lists_every_peer_seen():
    ledger = TrustLedger(POLICY)
    ledger.passed("e.0", "a")
    ledger.disagreed("e.1", "b")
    ledger.exclude("c", "caught")
    report = ledger.report()
    assert {peer: r["standing"] for peer, r in report.items()} == {"a": "proven", "b": "suspect", "c": "excluded"}
    assert report["a"]["audits_passed"] == 1 and report["b"]["audits_disagreed"] == 1
    assert report["b"]["experts"] == {"e.1": "suspect"}


def test_tables_are_bounded():
    ledger = TrustLedger(TrustPolicy(max_pairs=4, max_peers=3))
    for i in range(10):
        ledger.passed(f"e.{i}", f"p{i}")
        ledger.exclude(f"x{i}", "caught")
    assert len(ledger._pairs) == 4 and len(ledger._peers) == 3 and len(ledger._excluded) == 3
    assert ledger.excluded("x9") and not ledger.excluded("x0")  # the oldest exclusions go first
    assert ledger.standing("e.9", "p9") is Standing.PROVEN and ledger.standing("e.0", "p0") is Standing.UNPROVEN


@pytest.mark.parametrize("bad", [{"audit_rate": 1.5}, {"untrusted_rate": -0.1}, {"trust_after": 0},
                                 {"guard_strikes": 0}, {"max_pairs": 0}, {"suspect_rate": True}, {"audit_rate": "1%"}])
def test_policy_refuses_nonsense(bad):
    with pytest.raises(ExpertConfigError):
        TrustPolicy(**bad)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["passed", "disagreed", "rejected", "accepted", "replied", "exclude"]),
                          st.sampled_from(["e.0", "e.1"]), st.sampled_from(["a", "b", "c"])), max_size=60))
def test_any_sequence_of_observations_keeps_the_ledger_coherent(events):
    ledger = TrustLedger(POLICY)
    excluded = set()
    for what, uid, peer in events:
        if what in ("accepted", "replied"):
            getattr(ledger, what)(peer)
        elif what == "exclude":
            ledger.exclude(peer, "caught")
            excluded.add(peer)
        else:
            getattr(ledger, what)(uid, peer)
        for p in "abc":
            for u in ("e.0", "e.1"):
                probability = ledger.audit_probability(u, p)
                assert 0.0 <= probability <= 1.0
                assert (probability == 0.0) == (p in excluded) == (ledger.pick_weight(u, p) == 0.0)
                assert (ledger.standing(u, p) is Standing.EXCLUDED) == (p in excluded)
    assert {p for p, r in ledger.report().items() if r["standing"] == "excluded"} == excluded


def test_a_peer_outvoted_on_two_different_experts_is_excluded_and_one_expert_twice_is_not():
    ledger = TrustLedger()
    prove(ledger, "p")
    assert not ledger.outvoted("e.0", "p") and not ledger.outvoted("e.0", "p")  # one expert, twice
    assert ledger.standing("e.0", "p") is Standing.OUTVOTED and ledger.pick_weight("e.0", "p") == 0.0
    ledger.disagreed("e.0", "p")
    ledger.passed("e.0", "p")  # an audit in flight that ends later does not lift a verdict
    assert ledger.standing("e.0", "p") is Standing.OUTVOTED
    # checked and picked as a suspect on its other experts until trusted again
    policy = ledger.policy
    assert ledger.pick_weight("e.1", "p") == policy.suspect_weight and ledger.peer_standing("p") is Standing.OUTVOTED
    assert ledger.audit_probability("e.1", "p") == policy.suspect_rate
    assert ledger.outvoted("e.1", "p")  # the caller excludes it now
    assert ledger.report()["p"]["outvoted_on"] == ["e.0", "e.1"] and ledger.outvoted_on("p") == ["e.0", "e.1"]
    assert TrustLedger(TrustPolicy(outvotes_to_exclude=1)).outvoted("e.0", "q")


def test_an_outvoted_peer_that_passes_trust_after_audits_in_a_row_is_no_longer_suspected():
    ledger = TrustLedger(TrustPolicy(trust_after=3))
    prove(ledger, "p")
    ledger.outvoted("e.0", "p")
    for _ in range(3):
        assert ledger.audit_probability("e.1", "p") == ledger.policy.suspect_rate
        ledger.passed("e.1", "p")
    assert ledger.pick_weight("e.1", "p") == ledger.policy.proven_weight and ledger.pick_weight("e.0", "p") == 0.0
    assert ledger.audit_probability("e.1", "p") < ledger.policy.suspect_rate


def test_a_stale_pair_is_lifted_only_by_a_declared_sync():
    ledger = TrustLedger()
    assert ledger.stale("e.0", "p") and not ledger.stale("e.0", "p")
    ledger.disagreed("e.0", "p")
    assert ledger.standing("e.0", "p") is Standing.STALE and ledger.pick_weight("e.0", "p") == 0.0
    ledger.realigned("e.0", "p")
    assert ledger.standing("e.0", "p") is Standing.UNPROVEN


def test_a_mixture_never_picks_a_host_outvoted_on_the_expert_even_as_its_last_one():
    from types import SimpleNamespace

    from volunteer.experts.moe import RemoteMixtureOfExperts

    moe = RemoteMixtureOfExperts(None, in_features=4, grid_size=(1,), uid_prefix="e", audits=False)
    host = SimpleNamespace(peer="p", load=0.0, synced_age=1.0)
    assert moe._pick_host("e.0", [host]) is host
    moe.trust.outvoted("e.0", "p")  # its last replica of e.0, but outvoted there: not called for it
    assert moe._pick_host("e.0", [host]) is None
    assert moe._pick_host("e.0", [host, SimpleNamespace(peer="q", load=0.0, synced_age=None)]).peer == "q"
