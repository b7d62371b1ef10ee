"""The churn example's ledger (examples/churn_swarm.py): what it counts as lost and what not."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from churn_swarm import ExpertLedger  # noqa: E402


@dataclass(frozen=True)
class Decl:
    peer: str
    heartbeat: float
    version: int
    expiration: float = 1000.0


def test_a_stale_dht_copy_of_a_hosts_older_heartbeat_is_no_loss():
    ledger = ExpertLedger(verbose=False)
    ledger.observe({"e.0": [Decl("a", 10.0, 7), Decl("b", 10.0, 5)]}, now=10.0)
    ledger.observe({"e.0": [Decl("a", 5.0, 6), Decl("b", 11.0, 5)]}, now=11.0)  # a's previous heartbeat
    assert (ledger.updates_lost, ledger.experts_lost, ledger.best["e.0"]) == (0, 0, 7)
    assert ledger.stale_answers == 1


def test_a_host_missing_from_one_answer_counts_until_its_declaration_expires():
    ledger = ExpertLedger(verbose=False)
    ledger.observe({"e.0": [Decl("a", 10.0, 7, expiration=25.0), Decl("b", 10.0, 5, expiration=25.0)]}, now=10.0)
    ledger.observe({"e.0": [Decl("b", 12.0, 6, expiration=27.0)]}, now=12.0)  # a partial answer
    assert (ledger.updates_lost, ledger.best["e.0"]) == (0, 7)
    ledger.observe({"e.0": [Decl("b", 26.0, 6, expiration=41.0)]}, now=26.0)  # a's record is gone for good
    assert (ledger.updates_lost, ledger.experts_lost, ledger.best["e.0"]) == (1, 0, 6)


def test_a_host_declaring_a_lower_version_in_a_newer_heartbeat_loses_updates():
    ledger = ExpertLedger(verbose=False)
    ledger.observe({"e.0": [Decl("a", 10.0, 7)]}, now=10.0)
    ledger.observe({"e.0": [Decl("a", 20.0, 3)]}, now=20.0)
    assert (ledger.updates_lost, ledger.experts_lost) == (4, 0)
    ledger.observe({"e.0": [Decl("a", 30.0, 0)]}, now=30.0)
    assert (ledger.updates_lost, ledger.experts_lost) == (7, 1)


def test_the_freshest_replica_leaving_loses_what_the_others_lack_and_empty_answers_count_nothing():
    ledger = ExpertLedger(verbose=False)
    ledger.observe({"e.0": [Decl("a", 10.0, 9, expiration=20.0), Decl("b", 10.0, 8)], "e.1": []}, now=10.0)
    ledger.observe({"e.0": [Decl("b", 22.0, 8)], "e.1": []}, now=22.0)
    assert (ledger.updates_lost, ledger.experts_lost, ledger.best["e.0"]) == (1, 0, 8)
    assert "e.1" not in ledger.best
