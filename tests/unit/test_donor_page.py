"""The donor's page says one thing at a time: a paused badge is not followed by "now: running",
the text beside the buttons names the buttons, and withdrawn experts do not look live."""

from __future__ import annotations

import pytest
from markupsafe import escape

from volunteer.donor.history import History
from volunteer.cli.webpage import render_live, render_page

NOW = 1_900_000_000.0


def paused_by_you() -> dict:
    return {
        "swarm": "demo", "peer_id": "12D3KooWtest", "paused": True,
        "state_text": "paused by you (cli): `volunteer fold` resumes",
        "conduct": {"state": "paused", "text": "paused by you (cli): `volunteer fold` resumes", "events": []},
        "policy": {"lines": ["pause on battery"], "verdict": {"state": "running", "text": "running"}, "observed": None},
        "experts": [{"uid": "ffn.0.1", "requests": 12, "requests_per_s": 3.5}],
    }


def test_a_paused_page_does_not_say_running_nor_name_the_command_beside_its_button():
    html = render_live(paused_by_you(), History(), NOW)
    assert ">paused</span>" in html
    assert "now: <b>running" not in html and "would allow running; held back: paused" in html
    assert "`volunteer fold`" not in html and "paused by you (cli): the Fold button resumes" in html
    assert "withdrawn while paused" in html and "<td>withdrawn</td>" in html and "3.50" not in html


def test_a_folding_page_shows_live_experts_and_the_policys_own_pause():
    snap = paused_by_you()
    snap.update(paused=False, state_text="folding")
    snap["conduct"] = {"state": "folding", "text": "folding", "events": []}
    html = render_live(snap, History(), NOW)
    assert "<td>serving</td>" in html and "3.50" in html and "policies: <b>allow running</b>" in html
    snap.update(paused=True, state_text="paused: on battery")
    snap["conduct"] = {"state": "paused", "text": "paused: on battery", "events": []}
    snap["policy"]["verdict"] = {"state": "paused", "text": "paused: on battery"}
    assert "policies: <b>paused: on battery</b>" in render_live(snap, History(), NOW)


@pytest.mark.parametrize("bad", ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>'])
def test_every_field_of_the_donors_page_renders_escaped(bad):
    """The donor's page (it holds the token): a hostile swarm name, peer id, expert uid, state
    text, policy line, set-aside reason, connection, event and log line all show as text."""
    snap = {
        "swarm": bad, "peer_id": bad, "paused": False, "state_text": bad, "reachable_how": bad,
        "conduct": {"state": bad, "text": bad, "events": [{"time": NOW, "action": bad, "origin": bad, "reason": bad}]},
        "policy": {"lines": [bad], "verdict": {"state": "paused", "text": bad},
                   "observed": {"gpu_users": [bad], "gpu_use": ""}},
        "self_care": {"set_aside": {bad: bad}, "visibility": {"visible": True, "rejoins": 0}},
        "compute": {"device": bad},
        "experts": [{"uid": bad, "requests": 1}],
        "connections": [{"peer_id": bad, "role": bad, "path": bad, "via": bad}],
        "log": [{"level": bad, "message": bad}],
    }
    html = render_page(snap, History(), NOW)
    assert bad not in html and "<img" not in html and "<script>alert" not in html
    assert html.count(str(escape(bad))) >= 12
