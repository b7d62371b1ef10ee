"""The pure halves of "a trainer is a principal": the learned gradient bound, the trainers' book
(strikes, refusals, shares), certificates and the swarm file's trainer policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from volunteer.experts.gradbound import NormBound, Verdict
from volunteer.experts.trainers import (
    TrainerAdmission,
    TrainerBook,
    TrainerCertificate,
    TrainerCertificateError,
    TrainerPolicy,
    public_key_text,
)
from volunteer.net.identity import KeyPair
from volunteer.swarmfile import SwarmFileError, load_swarm_file


def warmed(norms=(1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05, 0.95)) -> NormBound:
    bound = NormBound(factor=10, gross=100, window=64, warmup=8)
    for norm in norms:
        bound.taken(bound.check(norm), "honest")
    return bound


def test_the_bound_is_learned_from_taken_norms_and_never_from_clipped_ones():
    bound = NormBound(warmup=8)
    assert bound.warming_up and bound.bound == math.inf
    bound = warmed()
    assert bound.bound == pytest.approx(10.0)
    clipped = bound.check(50.0)
    assert clipped.verdict is Verdict.CLIPPED and clipped.scale == pytest.approx(0.2)
    for _ in range(100):  # a steady pusher at the bound's edge cannot raise it
        bound.taken(bound.check(50.0), "pusher")
    assert bound.bound == pytest.approx(10.0)
    assert bound.check(1e6).verdict is Verdict.GROSS
    assert bound.check(math.nan).verdict is Verdict.GROSS
    assert bound.check(math.inf).verdict is Verdict.GROSS
    assert bound.check(9.0).verdict is Verdict.TAKEN


def test_a_warm_up_outlier_is_found_from_the_third_norm_and_forgotten():
    bound = NormBound(warmup=8)
    bound.taken(bound.check(1e6), "attacker")  # first: nothing to judge it by
    assert bound.late_outliers() == []
    bound.taken(bound.check(1.0), "honest")
    assert bound.late_outliers() == []
    bound.taken(bound.check(1.1), "honest")
    assert bound.late_outliers() == ["attacker"]
    assert bound.late_outliers() == []  # each once
    for _ in range(6):
        bound.taken(bound.check(1.0), "honest")
    assert bound.bound == pytest.approx(10.0)  # the outlier taught nothing


def test_a_history_seeds_the_bound_only_before_the_first_gradient():
    bound = NormBound(warmup=8)
    bound.seed(2.0)
    assert not bound.warming_up and bound.bound == pytest.approx(20.0)
    late = NormBound(warmup=8)
    late.taken(late.check(1e6), "attacker")
    late.seed(1e6)  # a history the attacker just wrote is no reference
    assert late.warming_up


def test_strikes_refuse_a_trainer_for_a_doubling_period_and_name_what_it_struck():
    book = TrainerBook(max_strikes=3, strike_window=120, refusal_period=600)
    assert not book.strike("e.0", "t", now=0)
    assert not book.strike("e.1", "t", now=10)
    assert book.struck("t", now=10) == ["e.0", "e.1"]
    assert book.refused_until("t", now=10) is None
    assert book.strike("e.0", "t", now=20)  # the third within the window
    assert book.refused_until("t", now=20) == 620
    assert book.refused_until("t", now=700) is None
    book.clear_strikes("t")
    for now in (800, 801, 802):
        book.strike("e.0", "t", now=now)
    assert book.refused_until("t", now=802) == 802 + 1200  # a repeat: twice as long
    # strikes older than the window are forgotten
    other = TrainerBook(max_strikes=3, strike_window=120)
    assert not other.strike("e.0", "u", now=0)
    assert not other.strike("e.0", "u", now=200)
    assert not other.strike("e.0", "u", now=400)
    assert not other.open_strikes("e.0", now=600)
    assert other.open_strikes("e.0", now=500)


def test_a_trainers_share_is_bounded_only_while_others_train_the_expert():
    book = TrainerBook(share_window=64)
    for _ in range(64):
        book.applied("e", "alone", clipped=False)
    assert not book.share_exceeded("e", "alone", now=0)  # alone: nobody to outweigh
    book.applied("e", "passer-by", clipped=False)
    assert not book.share_exceeded("e", "alone", now=0)  # a few backwards of another do not cap it
    fair = TrainerBook(share_window=64)
    for i in range(64):
        fair.applied("e", "a" if i % 5 else "b", clipped=False)  # a sends 4 of 5
    assert fair.share_exceeded("e", "a", now=0)
    assert not fair.share_exceeded("e", "b", now=0)
    fair.cause("b", now=0)  # a refused trainer counts for nobody
    assert not fair.share_exceeded("e", "a", now=1)


def test_certificates_admit_their_trainer_to_their_swarm_until_they_expire():
    organiser, trainer = KeyPair.generate(), KeyPair.generate()
    cert = TrainerCertificate.issue(organiser, "demo", trainer.peer_id, 10_000)
    again = TrainerCertificate.from_text(cert.to_text())
    again.verify(organiser=organiser.public_key, swarm_id="demo", trainer=trainer.peer_id, now=9_000)
    with pytest.raises(TrainerCertificateError, match="expired"):
        again.verify(organiser=organiser.public_key, swarm_id="demo", trainer=trainer.peer_id, now=20_000)
    with pytest.raises(TrainerCertificateError, match="another peer"):
        again.verify(organiser=organiser.public_key, swarm_id="demo", trainer=KeyPair.generate().peer_id, now=0)
    with pytest.raises(TrainerCertificateError, match="swarm"):
        again.verify(organiser=organiser.public_key, swarm_id="other", trainer=trainer.peer_id, now=0)
    with pytest.raises(TrainerCertificateError, match="another organiser"):
        again.verify(organiser=KeyPair.generate().public_key, swarm_id="demo", trainer=trainer.peer_id, now=0)
    tampered = bytearray(cert.encode())
    tampered[-1] ^= 1
    with pytest.raises(TrainerCertificateError):
        TrainerCertificate.decode(bytes(tampered)).verify(
            organiser=organiser.public_key, swarm_id="demo", trainer=trainer.peer_id, now=0)
    for junk in (b"", b"\x81", b"\x00" * 2000, b"\x82\xa1p\xc4\x01x\xa3sig\xc4\x00"):
        with pytest.raises(TrainerCertificateError):
            TrainerCertificate.decode(junk)


def test_admission_follows_the_policy():
    organiser, listed, stranger = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    assert TrainerAdmission(TrainerPolicy(), "s").refusal(stranger.peer_id, None, wall=0) is None
    by_list = TrainerAdmission(TrainerPolicy.from_settings([str(listed.peer_id)]), "s")
    assert by_list.refusal(listed.peer_id, None, wall=0) is None
    assert "not among them" in by_list.refusal(stranger.peer_id, None, wall=0)
    assert by_list.may_forward(stranger.peer_id, None, wall=0) is None  # forwards: everyone, by default
    by_cert = TrainerAdmission(
        TrainerPolicy.from_settings("open", organiser=public_key_text(organiser.public_key), forwards="trainers"), "s")
    cert = TrainerCertificate.issue(organiser, "s", stranger.peer_id, 1000).encode()
    assert by_cert.refusal(stranger.peer_id, cert, wall=0) is None
    assert by_cert.refusal(stranger.peer_id, cert, wall=0) is None  # remembered
    assert "present one" in by_cert.may_forward(listed.peer_id, None, wall=0)
    assert "expired" in by_cert.refusal(stranger.peer_id, cert, wall=10_000)


def test_swarm_files_say_who_trains(tmp_path):
    organiser, trainer = KeyPair.generate(), KeyPair.generate()
    path = tmp_path / "s.toml"
    path.write_text(f'name = "s"\ntrainers = ["{trainer.peer_id}"]\norganiser = "{public_key_text(organiser.public_key)}"\n'
                    'forwards = "trainers"\n')
    spec = load_swarm_file(path)
    assert spec.trainers == [str(trainer.peer_id)] and spec.forwards == "trainers"
    path.write_text(spec.to_toml())
    assert load_swarm_file(path).organiser == public_key_text(organiser.public_key)
    policy = TrainerPolicy.from_settings(spec.trainers, spec.organiser, spec.forwards)
    assert not policy.open and trainer.peer_id in policy.listed
    for text, fragment in (
        ('trainers = "closed"', 'trainers must be "open"'),
        ('trainers = ["12D3"]', "is not a peer ID"),
        ('trainers = [1]', "peer ID strings"),
        ('organiser = "nope"', "organiser must be"),
        ('forwards = "nobody"', 'forwards must be "everyone" or "trainers"'),
        ('kind = "hivemind"\ntrainers = []', "a hivemind swarm is open"),
    ):
        path.write_text(f'name = "s"\n{text}\n')
        with pytest.raises(SwarmFileError, match=fragment):
            load_swarm_file(path)


@given(st.binary(max_size=2048))
def test_random_bytes_never_crash_the_certificate_decoder(data):
    try:
        TrainerCertificate.decode(data)
    except TrainerCertificateError:
        pass


def test_fresh_identities_do_not_flush_a_refusal_from_the_book():
    book = TrainerBook(capacity=4)
    book.cause("attacker", now=0)
    for index in range(100):
        book.applied("e", f"sybil-{index}", clipped=False)
    assert book.refused_until("attacker", now=1) is not None
    assert len(book.snapshot(now=1)) == 4


def test_a_swarm_file_asks_for_exact_audits(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n')
    assert load_swarm_file(path).receipts is True  # exact audits: our kind's default
    path.write_text('name = "s"\nreceipts = false\n')
    spec = load_swarm_file(path)
    assert spec.receipts is False  # a swarm may opt out
    path.write_text(spec.to_toml())
    assert load_swarm_file(path).receipts is False
    path.write_text('name = "s"\nreceipts = "yes"\n')
    with pytest.raises(SwarmFileError, match="receipts"):
        load_swarm_file(path)


@given(st.lists(st.tuples(st.sampled_from(["e", "f"]), st.sampled_from("abcd")), max_size=200))
def test_the_share_counts_kept_as_backwards_come_and_go_are_those_of_the_window(applied):
    from collections import Counter

    book = TrainerBook(share_window=16)
    for uid, trainer in applied:
        book.applied(uid, trainer, clipped=False)
    for uid in ("e", "f"):
        window = book._recent.get(uid, ())
        assert book._recent_counts.get(uid, Counter()) == Counter(window)
        for trainer in "abcd":
            # the verdict from the kept counts is the one a fresh count of the window gives
            fresh = Counter(window)
            active = [t for t, n in fresh.items() if 8 * n >= len(window)]
            expected = (len(window) >= 8 and len(active) >= 2 and trainer in active
                        and fresh[trainer] > max(0.5, 1.5 / len(active)) * len(window))
            assert book.share_exceeded(uid, trainer, now=0) == expected
    book.forget_expert("e")
    assert "e" not in book._recent_counts
