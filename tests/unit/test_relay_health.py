"""The swarm health page's pure parts: observations → model (coverage, paths, contributors,
entry points), the model → HTML, JSON-ready dicts and Prometheus gauges, the profile record's
codec, and the SVG coverage map."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from dataclasses import replace

from relay.health import PeerCheck, SwarmObservation, entry_point_checks, expert_cell, health_model, is_relayed, swarm_model
from markupsafe import escape

from relay.healthpage import HealthCollector, coverage_map, render_page
from volunteer.dht.grid import Declaration
from volunteer.dht.profile import MAX_NAME_LENGTH, Profile, check_public_name, profile_item
from volunteer.errors import DHTRecordError
from volunteer.dht.vouches import Ledger, Vouch, VouchBook
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.swarmfile import GridSpec
from volunteer.web.svg import MAX_CELLS, Cell, cell_map

NOW = 1_700_000_000.0
GRID = GridSpec("ffn", (2, 2), "ffn", 8, replicas=2)
A, B, C = (KeyPair.generate().peer_id for _ in range(3))
DIRECT = (Multiaddr("/ip4/198.51.100.7/tcp/4001").to_bytes(),)
RELAYED = (Multiaddr(f"/ip4/203.0.113.1/tcp/4001/p2p/{C}/p2p-circuit").to_bytes(),)


def decl(peer, addrs=DIRECT, version=0, synced_age=None, heartbeat=NOW - 2) -> Declaration:
    return Declaration(peer, addrs, 0.0, heartbeat, version=version, synced_age=synced_age)


def observation(**changes) -> SwarmObservation:
    base = dict(
        swarm_id="demo", grids=(GRID,),
        experts={"ffn.0.0": [decl(A, version=7, synced_age=3.0), decl(B, RELAYED, version=5)], "ffn.0.1": [decl(A)]},
        profiles={str(A): Profile("Ada", calls=40, samples=400, bytes_sent=1000, experts=2),
                  str(B): Profile(None, calls=90, samples=900, experts=1, relayed=True)},
        entry_points=(PeerCheck("relay", "/ip4/203.0.113.1/tcp/4001", True, NOW - 4),
                      PeerCheck("bootstrap", "/ip4/203.0.113.2/tcp/4001", False, None)),
        observed_at=NOW - 1,
    )
    return SwarmObservation(**{**base, **changes})


def test_each_expert_cell_says_replicas_versions_last_sync_and_paths():
    model = swarm_model(observation(), NOW)
    cells = {c["uid"]: c for c in model["grids"][0]["cells"]}
    assert list(cells) == ["ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"]
    both = cells["ffn.0.0"]
    assert (both["replicas"], both["status"], both["version"], both["lagging"]) == (2, "covered", 7, 1)
    assert (both["direct"], both["relayed"]) == (1, 1)
    assert both["last_sync_s"] == 5.0  # 3 s before a heartbeat 2 s old
    assert (cells["ffn.0.1"]["status"], cells["ffn.0.1"]["last_sync_s"]) == ("under-replicated", None)
    assert cells["ffn.1.1"]["status"] == "missing" and cells["ffn.1.1"]["replicas"] == 0
    grid = model["grids"][0]
    assert (grid["covered"], grid["under_replicated"], grid["missing"], grid["healthy"]) == (1, 1, 2, False)


def test_one_host_declaring_twice_counts_once():
    assert expert_cell("ffn.0.0", [decl(A), decl(A)], 2, NOW)["replicas"] == 1


def test_a_swarm_is_healthy_when_every_expert_is_hosted_and_an_entry_point_answers():
    full = {uid: [decl(A), decl(B)] for uid in GRID.uids()}
    assert swarm_model(observation(experts=full), NOW)["healthy"]
    down = tuple(PeerCheck(p.role, p.addr, False) for p in observation().entry_points)
    assert not swarm_model(observation(experts=full, entry_points=down), NOW)["healthy"]
    assert swarm_model(observation(experts=full, entry_points=()), NOW)["healthy"]


def test_volunteers_paths_and_throughput_as_they_report_themselves():
    model = swarm_model(observation(), NOW)
    rows = {r["peer"]: r for r in model["volunteers"]["rows"]}
    assert rows[str(A)]["path"] == "direct" and rows[str(B)]["path"] == "relayed"
    assert (model["volunteers"]["up"], model["volunteers"]["direct"], model["volunteers"]["relayed"]) == (2, 1, 1)
    assert model["throughput"] == {"calls": 130, "samples": 1300, "bytes_sent": 1000}
    # self-reported counters rank nobody: without a trainer's vouch there are no contributors
    assert model["contributors"]["rows"] == []


TRAINER = KeyPair.generate()


def vouched(*work: tuple, trainer: KeyPair = TRAINER, at: float = NOW) -> list[Vouch]:
    """Vouches of ``trainer`` for (host, calls) pairs, one sample per call."""
    book = VouchBook(trainer, "demo", at - 100)
    for host, calls in work:
        for _ in range(calls):
            book.accept(host.to_bytes(), 1)
    return book.due(at)


def test_contributors_are_ranked_by_vouched_work_not_by_what_they_report():
    # B reports 90 calls and A 40, but trainers vouched for 3 of A's and none of B's
    model = swarm_model(observation(vouches=vouched((A, 3))), NOW)
    rows = model["contributors"]["rows"]
    assert [(r["peer"], r["name"], r["calls"], r["up"]) for r in rows] == [(str(A), "Ada", 3, True)]
    assert rows[0]["recent_per_day"] > 0 and rows[0]["trainers"] == 1


def test_a_paused_or_departed_donor_keeps_its_place_and_zero_never_outranks_some():
    ledger = Ledger("demo")
    for vouch in vouched((A, 2), (B, 5)):
        ledger.merge(vouch, NOW)
    # later, B has left (no declaration, no profile) and A reports a million calls of its own
    later = observation(experts={"ffn.0.1": [decl(A)]}, profiles={str(A): Profile("Ada", calls=1_000_000)}, vouches=())
    model = health_model([later], {}, NOW + 3600, ledgers={"demo": ledger})
    rows = model["swarms"][0]["contributors"]["rows"]
    assert [(r["peer"], r["calls"], r["up"]) for r in rows] == [(str(B), 5, False), (str(A), 2, True)]


def test_a_forged_or_self_vouch_counts_for_nobody_on_the_page():
    [honest] = vouched((A, 1))
    forged = replace(honest, calls=1000)
    selfish = Vouch("demo", A.to_bytes(), A.to_bytes(), 1, 1, NOW, 1000, 1000)
    model = swarm_model(observation(vouches=[forged, selfish]), NOW)
    assert model["contributors"]["rows"] == [] and model["contributors"]["refused"] == 2


def test_a_volunteer_without_a_profile_still_shows_from_its_declarations():
    model = swarm_model(observation(profiles={}), NOW)
    rows = {r["peer"]: r for r in model["volunteers"]["rows"]}
    assert rows[str(B)]["path"] == "relayed" and rows[str(B)]["name"] is None and rows[str(A)]["experts"] == 2


def test_the_model_publishes_no_volunteer_address():
    text = json.dumps(health_model([observation()], {"reservations": 1, "bytes_relayed": 5}, NOW))
    assert "198.51.100.7" not in text  # a volunteer's declared address
    assert "203.0.113.1" in text  # the swarm file's (public) entry points are shown


def test_entry_points_and_relay_figures():
    model = health_model([observation()], {"reservations": 3, "circuits": 1, "circuits_total": 9, "bytes_relayed": 77,
                                           "refusals": {"x": 1}}, NOW, relay_id="12D3KooWrelay")
    assert model["relay"] == {"peer": "12D3KooWrelay", "reservations": 3, "circuits": 1, "circuits_total": 9, "bytes_relayed": 77}
    points = model["swarms"][0]["entry_points"]
    assert [(p["role"], p["up"], p["last_seen_s"]) for p in points] == [("relay", True, 4.0), ("bootstrap", False, None)]


def test_is_relayed_needs_every_address_relayed():
    assert is_relayed(decl(A, RELAYED)) and not is_relayed(decl(A, DIRECT + RELAYED)) and not is_relayed(decl(A, ()))


def test_the_page_shows_the_map_the_contributors_and_escapes_names():
    evil = observation(profiles={str(A): Profile("<script>x</script>", calls=1)}, vouches=vouched((A, 2)))
    html = render_page(health_model([evil], {}, NOW))
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert html.count('class="cell covered"') == 1 and html.count('class="cell missing"') == 2
    assert 'id="map-ffn"' in html and "1 covered, 1 under-replicated, 2 missing of 4" in html
    assert "<script" not in html  # the public page runs no script at all
    assert "vouched for" in html and "halves every 7.0 days" in html  # what ranks, and how
    assert "looking at the swarm" in render_page(None)


HOSTILE = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "'><svg onload=alert(1)>")


@pytest.mark.parametrize("bad", HOSTILE)
def test_every_field_a_peer_or_a_swarm_file_controls_renders_escaped(bad):
    """A public name, a swarm id, an entry point's role and address, the relay id, and (put in
    the model directly: the swarm file's checks refuse them there) a grid's prefix and class
    and an expert uid: whatever they hold shows as text; no tag or attribute breaks out."""
    obs = observation(swarm_id=bad, profiles={str(A): Profile(bad, calls=1)},
                      entry_points=(PeerCheck(bad, bad, True, NOW),), vouches=VouchBook(TRAINER, bad, NOW).due(NOW))
    ledger = Ledger(bad)
    for vouch in vouched((A, 1)):
        ledger.merge(replace(vouch, swarm=bad).sign(TRAINER), NOW)
    model = health_model([obs], {"bytes_relayed": 1}, NOW, relay_id=bad, ledgers={bad: ledger})
    grid = model["swarms"][0]["grids"][0]
    grid.update(prefix=bad, expert=bad)
    grid["cells"][0]["uid"] = bad
    assert model["swarms"][0]["contributors"]["rows"][0]["name"] == bad  # the name is on the page
    html = render_page(model)
    assert bad not in html
    assert html.count(str(escape(bad))) >= 7


def test_a_swarm_without_grids_says_so():
    html = render_page(health_model([observation(grids=())], {}, NOW))
    assert 'id="no-grids"' in html


def test_coverage_map_lays_out_rows_along_the_first_index():
    grid = swarm_model(observation(grids=(GridSpec("g", (2, 2, 3), "ffn", 8),)), NOW)["grids"][0]
    svg = coverage_map(grid)
    assert svg.count("<rect") == 12 and svg.count(">g.0<") == 1 and svg.count(">g.1<") == 1


def test_cell_map_draws_at_most_max_cells():
    rows = [[Cell("#000", "t")] * 100 for _ in range(MAX_CELLS // 100 + 5)]
    assert cell_map(rows, title="big").count("<rect") == MAX_CELLS
    assert cell_map([], title="empty").startswith("<svg")


def test_prometheus_gauges_come_from_the_same_model():
    registry = CollectorRegistry()
    model = health_model([observation()], {}, NOW)
    registry.register(HealthCollector(lambda: model))
    text = generate_latest(registry).decode()
    assert 'volunteer_swarm_experts{grid="ffn",status="missing",swarm="demo"} 2.0' in text
    assert 'volunteer_swarm_expert_replicas{swarm="demo",uid="ffn.0.0"} 2.0' in text
    assert 'volunteer_swarm_volunteers{path="relayed",swarm="demo"} 1.0' in text
    assert 'volunteer_swarm_entry_point_up{addr="/ip4/203.0.113.2/tcp/4001",role="bootstrap",swarm="demo"} 0.0' in text
    assert 'volunteer_swarm_calls_served{swarm="demo"} 130.0' in text
    empty = CollectorRegistry()
    empty.register(HealthCollector(lambda: None))
    assert "volunteer_swarm_experts" in generate_latest(empty).decode()  # declared, without samples


def test_the_swarms_direct_shares_pool_what_volunteers_report():
    """Issue 34: the share of connections that ended direct and of bytes that went direct, pooled
    over the volunteers' profiles, on the page, in its JSON and in the metrics."""
    profiles = {
        str(A): Profile("Ada", peer_sessions=8, peer_sessions_direct=6, bytes_direct=900, bytes_relayed=100),
        str(B): Profile(None, relayed=True, peer_sessions=2, peer_sessions_direct=0, bytes_direct=0, bytes_relayed=1000),
        str(C): Profile("Cy"),  # runs no NAT manager (or has no peer yet): counts nothing
    }
    model = health_model([observation(profiles=profiles)], {}, NOW)
    direct = model["swarms"][0]["direct"]
    assert direct["direct_connection_share"] == 0.6 and direct["direct_data_share"] == 0.45
    assert direct["median_direct_connection_share"] == 0.375 and direct["median_direct_data_share"] == 0.45
    assert direct["reporting"] == 2 and direct["peer_sessions"] == 10 and direct["bytes_relayed"] == 1100
    rows = {row["peer"]: row for row in model["swarms"][0]["volunteers"]["rows"]}
    assert rows[str(A)]["direct_connection_share"] == 0.75 and rows[str(A)]["direct_data_share"] == 0.9
    assert rows[str(C)]["direct_connection_share"] is None and rows[str(C)]["direct_data_share"] is None
    json.dumps(model)
    page = render_page(model)
    assert "60 %" in page and "of connections ended direct" in page and "45 %" in page and "of bytes went direct" in page
    registry = CollectorRegistry()
    registry.register(HealthCollector(lambda: model))
    text = generate_latest(registry).decode()
    assert 'volunteer_swarm_direct_share{of="connections",swarm="demo"} 0.6' in text
    assert 'volunteer_swarm_direct_share{of="bytes",swarm="demo"} 0.45' in text


def test_no_direct_share_before_anyone_reports_one():
    model = health_model([observation()], {}, NOW)
    direct = model["swarms"][0]["direct"]
    assert direct["direct_connection_share"] is None and direct["direct_data_share"] is None and direct["reporting"] == 0
    assert "–" in render_page(model)
    registry = CollectorRegistry()
    registry.register(HealthCollector(lambda: model))
    assert "volunteer_swarm_direct_share{" not in generate_latest(registry).decode()


# --- the profile record ---------------------------------------------------------------------------


def test_profile_round_trips_and_leaves_out_what_is_not_set():
    profile = Profile("Grace", calls=3, samples=30, bytes_sent=99, experts=2, relayed=True)
    assert Profile.decode(profile.encode()) == profile
    assert "n" not in msgpack.unpackb(Profile().encode())
    assert not {"ps", "pd", "bd", "br"} & set(msgpack.unpackb(Profile().encode()))
    shares = Profile(peer_sessions=5, peer_sessions_direct=4, bytes_direct=10, bytes_relayed=2)
    assert Profile.decode(shares.encode()) == shares
    key, subkey, value, expiration = profile_item(A.to_bytes(), profile, NOW + 15)
    assert subkey == A.to_bytes() and Profile.decode(value) == profile and expiration == NOW + 15


@pytest.mark.parametrize("name", ["", " ", "x" * (MAX_NAME_LENGTH + 1), "tab\there", "new\nline"])
def test_public_names_are_short_printable_text(name):
    with pytest.raises(ValueError):
        check_public_name(name)


def test_a_public_name_may_hold_any_printable_text():
    assert check_public_name("  Ada's <lab> & co  ") == "Ada's <lab> & co"


@pytest.mark.parametrize("value", [
    msgpack.packb({"n": "x" * 41}), msgpack.packb({"c": -1}), msgpack.packb({"c": True}), msgpack.packb({"r": 2}),
    msgpack.packb([1, 2]), b"\xc1", msgpack.packb({"n": "a\x00b"}), b"\x80" * 2000,
    msgpack.packb({"ps": 1, "pd": 2}), msgpack.packb({"bd": -1}), msgpack.packb({"br": "x"}),
])
def test_malformed_profiles_are_refused(value):
    with pytest.raises(DHTRecordError):
        Profile.decode(value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_profile_decoder_takes_any_bytes(data):
    try:
        profile = Profile.decode(data)
    except DHTRecordError:
        return
    assert Profile.decode(profile.encode()) == profile


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["n", "c", "s", "b", "x", "r", "z", "ps", "pd", "bd", "br"]),
                       st.one_of(st.integers(-5, 2**64 - 1), st.text(max_size=50), st.booleans(), st.none(), st.binary(max_size=5)),
                       max_size=11))
def test_profile_decoder_takes_any_map(msg):
    try:
        profile = Profile.decode(msgpack.packb(msg, use_bin_type=True))
    except DHTRecordError:
        return
    assert profile.calls == msg.get("c", 0) and profile.name == msg.get("n")


def test_per_expert_series_are_bounded_per_scrape():
    from relay.healthpage import MAX_UID_SERIES

    big = GridSpec("big", (128, 64), "ffn", 8)  # 8192 experts
    registry = CollectorRegistry()
    model = health_model([observation(grids=(big,), experts={})], {}, NOW)
    registry.register(HealthCollector(lambda: model))
    text = generate_latest(registry).decode()
    assert text.count("volunteer_swarm_expert_replicas{") == MAX_UID_SERIES
    assert 'volunteer_swarm_experts{grid="big",status="missing",swarm="demo"} 8192.0' in text


def test_an_entry_point_named_as_relay_and_bootstrap_is_one_row():
    own, other = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    relay_tcp = Multiaddr(f"/ip4/203.0.113.1/tcp/4001/p2p/{other}")
    relay_quic = Multiaddr(f"/ip4/203.0.113.1/udp/4001/quic-v1/p2p/{other}")
    me = Multiaddr(f"/ip4/203.0.113.2/tcp/4001/p2p/{own}")
    rows = entry_point_checks((("relay", [relay_tcp, me]), ("bootstrap", [relay_quic, me])), own,
                              answered={str(relay_quic): True}, last_seen={str(relay_tcp): NOW - 60, str(relay_quic): NOW - 5})
    assert [(r.role, r.addr, r.up, r.last_seen, r.is_self) for r in rows] == [
        ("relay, bootstrap", str(relay_tcp), True, NOW - 5, False),  # up: its QUIC address answered
        ("relay, bootstrap", str(me), True, None, True),
    ]
