"""fold / pause / finish combined with the run-when verdict and self-care (``Conduct``), and
self-care's cores: consecutive failures per expert, visibility of our own experts."""

from __future__ import annotations

import pytest

from volunteer.donor.fold import LONG_PAUSE, Conduct
from volunteer.donor.policy import RUN, Verdict
from volunteer.donor.selfcare import FailureStreaks, VisibilityWatch


def test_a_first_start_without_consent_waits_for_fold():
    conduct = Conduct(folding=False, origin="consent", reason="waiting for your consent", now=0)
    assert not conduct.serving and conduct.state == "paused"
    assert conduct.text == "paused until you agree to donate: `volunteer fold` starts"
    event = conduct.ask("fold", "cli", 5)
    assert event.line == "fold (cli)" and conduct.serving and conduct.state == "folding"
    assert [(e.action, e.origin) for e in conduct.events] == [("pause", "consent"), ("fold", "cli")]
    assert conduct.ask("fold", "web", 6) is None  # already folding: nothing logged


def test_pause_fold_finish_with_origins():
    conduct = Conduct(now=0)
    conduct.ask("pause", "web", 1)
    assert conduct.text == "paused by you (web): `volunteer fold` resumes" and not conduct.serving
    conduct.ask("finish", "cli", 2)
    assert conduct.state == "finishing" and not conduct.serving
    assert conduct.finished(3).action == "finished" and conduct.state == "finished"
    assert conduct.ask("pause", "cli", 4) is None and conduct.ask("finish", "cli", 4) is None
    conduct.ask("fold", "web", 5)
    assert conduct.serving
    assert [e.action for e in conduct.events] == ["fold", "pause", "finish", "finished", "fold"]
    with pytest.raises(ValueError):
        conduct.ask("dance", "cli", 6)


def test_the_policy_holds_a_folding_daemon_back_and_says_why():
    conduct = Conduct(now=0)
    event = conduct.set_verdict(Verdict("paused", "on battery", "battery"), 10)
    assert event.line == "paused (policy): on battery" and conduct.text == "paused: on battery"
    assert conduct.set_verdict(Verdict("paused", "on battery", "battery"), 11) is None  # same decision, no new line
    event = conduct.set_verdict(RUN, 20)
    assert event.action == "resume" and event.origin == "policy" and conduct.serving
    conduct.ask("pause", "cli", 21)
    conduct.set_verdict(Verdict("waiting", "computer in use, resumes after 3 idle minutes", "idle"), 22)
    assert conduct.text.startswith("paused by you")  # the donor's own pause says more than the policy's


def test_a_pause_that_lasts_hands_off_once():
    conduct = Conduct(now=0)
    conduct.set_verdict(Verdict("paused", "outside computing hours", "hours", until=100 + LONG_PAUSE), 100)
    assert conduct.pause_lasts(100)  # its end is known to be far
    conduct.handed_off = True
    assert not conduct.pause_lasts(101)
    conduct.set_verdict(RUN, 200)
    conduct.set_verdict(Verdict("paused", "on battery", "battery"), 300)  # no known end
    assert not conduct.pause_lasts(300) and conduct.pause_lasts(300 + LONG_PAUSE)
    conduct.ask("finish", "cli", 400)
    assert not conduct.pause_lasts(400 + 2 * LONG_PAUSE)  # a finish hands off itself


def test_self_care_hold():
    conduct = Conduct(now=0)
    event = conduct.set_hold("all 2 expert(s) failed 5 calls in a row", 1)
    assert event.origin == "self-care" and not conduct.serving and conduct.state == "paused"
    assert conduct.text == "paused: all 2 expert(s) failed 5 calls in a row"
    assert conduct.set_hold(None, 2).action == "resume" and conduct.serving
    view = conduct.view(3)
    assert view["state"] == "folding" and view["events"][-1]["origin"] == "self-care"


def test_failure_streaks_set_an_expert_aside_after_k_in_a_row():
    streaks = FailureStreaks(limit=3)
    assert not streaks.failed("e.0", "boom") and not streaks.failed("e.0", "boom")
    streaks.succeeded("e.0")  # a success in between starts the count over
    assert not streaks.failed("e.0", "boom") and not streaks.failed("e.0", "boom")
    assert streaks.failed("e.0", "RuntimeError: boom")
    assert "failed 3 calls in a row (last: RuntimeError: boom)" == streaks.set_aside["e.0"]
    assert not streaks.failed("e.0", "again")  # already set aside: said once
    assert streaks.hold({"e.1"}) is None and "all 1 expert(s) failed 3 calls in a row" in streaks.hold(set())
    assert streaks.take_back() == ["e.0"] and streaks.hold(set()) is None


def test_visibility_rejoins_after_two_missed_heartbeats():
    watch = VisibilityWatch()
    assert watch.visible is None and not watch.observe(True, 0) and watch.visible
    assert not watch.observe(False, 5) and watch.visible is False
    assert watch.observe(False, 10) and watch.rejoins == 1 and watch.misses == 0
    assert not watch.observe(False, 15)
    watch.reset()  # paused: nothing should be visible
    assert not watch.observe(False, 20)
    assert watch.view(25)["last_rejoin_age_s"] == 15


def test_visibility_looks_up_less_often_while_seen_and_every_heartbeat_after_a_miss():
    """A look-up of our own experts costs about what a heartbeat does: one a heartbeat doubled
    a donor's DHT requests. While seen they thin out to one every max_quiet heartbeats."""
    watch = VisibilityWatch(max_quiet=12)
    assert watch.quiet == 1
    gaps = []
    for t in range(6):
        watch.observe(True, t)
        gaps.append(watch.quiet)
    assert gaps == [2, 4, 8, 12, 12, 12]
    assert not watch.observe(False, 100) and watch.quiet == 1  # a miss: looked at again next heartbeat
    assert watch.observe(False, 105) and watch.rejoins == 1  # so two misses still take two heartbeats
    watch.observe(True, 110)
    watch.reset()  # paused: once serving again, the next look-up is a heartbeat later
    assert watch.quiet == 1


def test_swarm_contact_cut_off_after_the_grace_redials_each_period_and_comes_back():
    from volunteer.donor.selfcare import SwarmContact

    contact = SwarmContact(grace=10, redial_period=30)
    assert contact.observe(3, 0) is None
    assert contact.observe(0, 100) is None and contact.observe(0, 105) is None  # a moment alone is not cut off
    assert contact.observe(1, 108) is None and contact.alone_since is None
    assert contact.observe(0, 200) is None
    assert contact.observe(0, 210) == "cut" and contact.cut_off_since == 200 and contact.redials == 1
    assert contact.text("22:41:00") == ("cut off from the swarm since 22:41:00: no peer connected; "
                                        "re-dialling its bootstrap peers and relays every 30 s")
    assert contact.observe(0, 230) is None
    assert contact.observe(0, 240) == "redial" and contact.redials == 2
    assert contact.view(250) == {"cut_off": True, "cut_off_for_s": 50.0, "cut_off_since": 200, "redials": 2, "cut_offs": 1}
    assert contact.observe(2, 251) == "back" and contact.text("x") is None
    assert contact.observe(2, 260) is None and contact.view(260)["cut_off"] is False


def test_a_pause_or_finish_is_kept_across_a_restart_until_fold(tmp_path):
    from volunteer.donor.fold import choice_path, load_choice, save_choice

    path = choice_path(tmp_path, "demo/../x")
    assert path.parent == tmp_path / "conduct" and load_choice(path) is None
    conduct = Conduct(now=100.0)
    conduct.ask("pause", "web", 200.0)
    assert save_choice(path, conduct)
    kept = load_choice(path)
    assert (kept.choice, kept.origin, kept.since) == ("paused", "web", 200.0)
    again = Conduct.kept(kept, now=5000.0)  # the next daemon starts as the donor left this one
    assert not again.serving and again.state == "paused" and again.origin == "web"
    assert again.text == "paused by you (web): `volunteer fold` resumes"
    assert "kept from before the restart" in again.events[-1].reason
    again.ask("fold", "cli", 5001.0)
    assert save_choice(path, again) and not path.exists() and load_choice(path) is None
    # a finish under way when the daemon stopped comes back finished; malformed files are none
    finishing = Conduct(now=0.0)
    finishing.ask("finish", "cli", 1.0)
    save_choice(path, finishing)
    assert Conduct.kept(load_choice(path), now=2.0).state == "finished"
    for text in ("{", '{"choice": "folding", "origin": "cli", "since": 1}', '{"choice": "paused", "origin": "x", "since": 1}',
                 '{"choice": "paused", "origin": "cli", "since": true}', "[]"):
        path.write_text(text)
        assert load_choice(path) is None, text
