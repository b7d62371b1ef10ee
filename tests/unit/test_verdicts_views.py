"""Shared verdicts made visible: the relay's health page lists the volunteers a checked proof
excludes (escaped: an accusation's text is a peer's), and counts what changed nothing."""

from __future__ import annotations

from relay.health import health_model, swarm_model
from relay.healthpage import render_page

from .test_relay_health import NOW, A, B, observation


def test_the_health_page_lists_exclusions_on_proof_and_counts_refused_accusations():
    proof = {"accuser": str(B), "uid": "ffn.0.0", "reason": f"proof published by {B}: its outputs differ <b>"}
    obs = observation(excluded={str(A): proof}, accusations_refused=3)
    model = swarm_model(obs, NOW)
    (row,) = model["verdicts"]["rows"]
    assert row["peer"] == str(A) and row["name"] == "Ada" and row["uid"] == "ffn.0.0" and row["up"]
    assert model["verdicts"]["refused"] == 3
    html = render_page(health_model([obs], {}, NOW))
    assert 'id="verdicts"' in html and "Excluded on proof" in html and "its outputs differ &lt;b&gt;" in html
    assert "exclude nobody: 3 so far" in html


def test_no_exclusion_until_a_proof_checks_out():
    model = swarm_model(observation(), NOW)
    assert model["verdicts"] == {"rows": [], "count": 0, "refused": 0}
    assert "no published proof has checked out" in render_page(health_model([observation()], {}, NOW))


def test_volunteer_experts_shows_each_hosts_verdict_and_why():
    from rich.console import Console

    from volunteer.cli.expertscmd import experts_table, print_verdicts, with_verdicts
    from volunteer.kinds.base import ExpertListing

    rows = [{"uid": "ffn.0.0", "peer_id": str(A), "version": 3, "claim": "plausible"},
            {"uid": "ffn.0.0", "peer_id": str(B), "version": 3, "claim": "plausible"},
            {"uid": "ffn.0.1", "peer_id": str(B), "version": 1, "claim": "sole"}]
    listing = ExpertListing(rows, "swarm 'demo'", ("uid", "host", "version", "claim"))
    report = {"excluded": {str(B): {"accuser": str(A), "uid": "ffn.0.0", "reason": f"proof published by {A}: [x1.02]"}},
              "unproven": {str(A): "a recompute reproduces the reply"}, "refused": {"not_proven": 1}, "checks": 2}
    shown = with_verdicts(listing, report)
    assert shown.columns[-1] == "verdict"
    assert [r["verdict"] for r in shown.rows] == ["accused", "excluded", "excluded"]
    console = Console(record=True, width=200)
    console.print(experts_table(shown))
    print_verdicts(console, shown.rows)
    text = console.export_text()
    assert "excluded" in text and f"{B}: proof published by {A}: [x1.02]" in text
    assert f"accused, not proven {A}: a recompute reproduces the reply (changes nothing)" in text
