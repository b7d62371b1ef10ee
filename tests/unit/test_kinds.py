"""The swarm-kind registry: every kind a swarm file may name has exactly one plug, looked up in
one place, and the peerstore keeps only the addresses of a declaration that parse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from volunteer.errors import VolunteerError
from volunteer.kinds import KINDS, HivemindKind, VolunteerKind, kind_of
from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.net.peerstore import MAX_ADDRS_PER_PEER, Peerstore
from volunteer.swarmfile import SWARM_KINDS, SwarmSpec

PEER = KeyPair.generate().peer_id


def test_every_kind_a_swarm_file_may_name_has_one_plug():
    assert set(KINDS) == set(SWARM_KINDS)
    assert all(kind.name == name for name, kind in KINDS.items())
    assert isinstance(kind_of(SwarmSpec("a", "a")), VolunteerKind)
    assert isinstance(kind_of(SwarmSpec("h", "h", kind="hivemind")), HivemindKind)
    assert kind_of("hivemind") is kind_of(SwarmSpec("h", "h", kind="hivemind"))


def test_an_unknown_kind_is_a_clear_error():
    with pytest.raises(VolunteerError, match="unknown swarm kind 'bittorrent': expected one of volunteer, hivemind"):
        kind_of(SwarmSpec("b", "b", kind="bittorrent"))


def test_doctor_plans_name_whom_each_kind_checks():
    relay = Multiaddr(f"/ip4/192.0.2.1/tcp/4001/p2p/{PEER}")
    boot = Multiaddr(f"/ip4/192.0.2.2/tcp/4001/p2p/{PEER}")
    ours = kind_of("volunteer").doctor_plan(SwarmSpec("a", "a", [boot], [relay]))
    assert ours.peers == [boot, relay] and ours.perf
    theirs = kind_of("hivemind").doctor_plan(SwarmSpec("h", "h", [boot], kind="hivemind"))
    assert theirs.peers == [boot] and not theirs.perf  # p2pd serves no perf
    with pytest.raises(VolunteerError, match="lists no bootstrap peers or relays to check"):
        kind_of("volunteer").doctor_plan(SwarmSpec("a", "a"))
    with pytest.raises(VolunteerError, match="lists no initial peers to check"):
        kind_of("hivemind").doctor_plan(SwarmSpec("h", "h", kind="hivemind"))


def test_remember_addrs_keeps_what_parses_in_any_form():
    store = Peerstore()
    direct = Multiaddr("/ip4/192.0.2.7/tcp/4001")
    relayed = Multiaddr(f"/ip4/192.0.2.8/tcp/4001/p2p/{PEER}/p2p-circuit")
    kept = store.remember_addrs(PEER, [direct.to_bytes(), str(relayed), b"\xff\x00junk", "not a multiaddr", direct])
    assert kept == 3
    assert set(store.addrs(PEER)) == {direct, relayed}


@given(st.lists(st.one_of(st.binary(max_size=64), st.text(max_size=64)), max_size=50))
def test_remember_addrs_never_raises_on_what_a_peer_declares(addrs):
    store = Peerstore()
    kept = store.remember_addrs(PEER, addrs)
    assert 0 <= kept <= len(addrs)
    assert len(store.addrs(PEER)) <= min(kept, MAX_ADDRS_PER_PEER)
