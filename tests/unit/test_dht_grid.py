"""The expert directory (grid.py): uid grammar, declarations, choosing hosts, beam search over a fake store (pure)."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.dht.config import DHTConfig
from volunteer.dht.beam import BeamSearch
from volunteer.dht.grid import (
    Declaration,
    HostInfo,
    grid_prefixes,
    is_valid_uid,
    make_declarations,
    make_tombstones,
    make_uid,
    parse_prefix,
    parse_uid,
    select_alive,
)
from volunteer.dht.records import Storage, owned_subkey, sign
from volunteer.errors import DHTRecordError, ExpertUIDError
from volunteer.net.identity import KeyPair

CONFIG = DHTConfig()
NOW = 10_000.0


def find_best_experts(prefix, grid_scores, beam_size, get_many, now, config=None):
    """Drive a BeamSearch with a synchronous ``get_many(keys) -> {key: records}`` (a fake store)."""
    search = BeamSearch(prefix, grid_scores, beam_size, now, config)
    while keys := search.wanted():
        search.feed(get_many(keys), now)
    return search.result()


# --- grammar -----------------------------------------------------------------------------------
@pytest.mark.parametrize("uid,parsed", [("ffn.3", ("ffn", (3,))), ("a_b-c.0.10.7", ("a_b-c", (0, 10, 7)))])
def test_parse_uid(uid: str, parsed) -> None:
    assert parse_uid(uid) == parsed and is_valid_uid(uid)
    assert make_uid(*parsed) == uid


@pytest.mark.parametrize(
    "uid",
    ["ffn", "ffn.", ".3", "ffn.03", "ffn.-1", "ffn.3.", "ffn..3", "f f.3", "ffn.x", "", "é.1",
     "ffn." + ".".join(["1"] * 9), "ffn.1048576", "a" * 300 + ".1", 5],
)
def test_invalid_uids(uid) -> None:
    assert not is_valid_uid(uid)
    with pytest.raises(ExpertUIDError):
        parse_uid(uid)


def test_prefixes() -> None:
    assert grid_prefixes("ffn.3.5.7") == ["ffn.", "ffn.3.", "ffn.3.5."]
    assert grid_prefixes("ffn.3") == ["ffn."]
    assert parse_prefix("ffn.") == ("ffn", ())
    assert parse_prefix("ffn.3.5.") == ("ffn", (3, 5))
    for bad in ("ffn", "ffn.3", "ffn..", ".3."):
        with pytest.raises(ExpertUIDError):
            parse_prefix(bad)


# --- declarations ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def host_kp() -> KeyPair:
    return KeyPair.generate()


def test_make_declarations_one_record_per_uid_and_prefix(host_kp: KeyPair) -> None:
    host = HostInfo(host_kp.peer_id, (b"/ip4/addr",), load=2.0)
    uids = ["ffn.3.5", "ffn.3.7", "ffn.4.1", "ffn.3.5"]
    items = make_declarations(uids, host, NOW, NOW + 15, loads={"ffn.3.7": 0.5})
    keys = [k for k, _, _, _ in items]
    assert keys == [b"ffn.3.5", b"ffn.3.7", b"ffn.4.1", b"ffn.", b"ffn.3.", b"ffn.4."]
    assert all(sub == host_kp.peer_id.to_bytes() and exp == NOW + 15 for _, sub, _, exp in items)
    decl = Declaration.decode(items[1][2], CONFIG)
    assert (decl.peer, decl.addrs, decl.load, decl.heartbeat, decl.children) == (
        host_kp.peer_id, (b"/ip4/addr",), 0.5, NOW, ()
    )
    assert Declaration.decode(items[3][2], CONFIG).children == ((3, "ffn.3.7"), (4, "ffn.4.1"))  # the root lists the grid
    assert Declaration.decode(items[4][2], CONFIG).children == ((5, "ffn.3.5"), (7, "ffn.3.7"))
    three_d = make_declarations(["x.1.2.3", "x.1.2.4", "x.1.9.0"], host, NOW, NOW + 15, loads={"x.1.2.4": 0.1})
    children = {k: Declaration.decode(v, CONFIG).children for k, _, v, _ in three_d}
    assert children[b"x.1."] == ((2, "x.1.2.4"), (9, "x.1.9.0"))  # least loaded uid below index 2
    assert children[b"x.1.2."] == ((3, "x.1.2.3"), (4, "x.1.2.4"))
    with pytest.raises(ExpertUIDError):
        make_declarations(["bad uid"], host, NOW, NOW + 15)
    with pytest.raises(DHTRecordError):
        make_declarations(["ffn.1"], HostInfo(host_kp.peer_id, (b"x" * 9000,)), NOW, NOW + 15)


def test_declarations_carry_versions(host_kp: KeyPair) -> None:
    host = HostInfo(host_kp.peer_id, (b"/ip4/addr",))
    versions = {"ffn.3.5": 7, "ffn.3.7": 2**63 - 1}  # ffn.4.1 left out: version 0
    items = make_declarations(["ffn.3.5", "ffn.3.7", "ffn.4.1"], host, NOW, NOW + 15, versions=versions)
    decoded = {k: Declaration.decode(v, CONFIG) for k, _, v, _ in items}
    assert [decoded[k].version for k in (b"ffn.3.5", b"ffn.3.7", b"ffn.4.1")] == [7, 2**63 - 1, 0]
    assert "v" not in msgpack.unpackb(items[2][2])  # zero is left out: a record the size it was before versions
    # prefix records list each child's version; a leaf's declaration through its prefix record has it
    assert decoded[b"ffn.3."].child_versions == ((5, 7), (7, 2**63 - 1))
    assert decoded[b"ffn.3."].for_child(5).version == 7 and decoded[b"ffn.3."].for_child(7).version == 2**63 - 1
    assert decoded[b"ffn.4."].child_versions == () and decoded[b"ffn.4."].for_child(1).version == 0
    assert Declaration.decode(decoded[b"ffn.3."].encode(), CONFIG) == decoded[b"ffn.3."]  # round trip
    for bad in (-1, 2**63, 1.5, True, "3"):
        with pytest.raises(DHTRecordError):
            make_declarations(["ffn.1"], host, NOW, NOW + 15, versions={"ffn.1": bad})


def test_declaration_without_version_decodes_as_zero(host_kp: KeyPair) -> None:
    # a record from a host that predates versions
    old = msgpack.packb({"p": host_kp.peer_id.to_bytes(), "a": [], "l": 0.0, "h": NOW, "n": {1: "ffn.1.2"}},
                        use_bin_type=True)
    decl = Declaration.decode(old, CONFIG)
    assert decl.version == 0 and decl.child_versions == () and decl.for_child(1).version == 0


@pytest.mark.parametrize(
    "extra",
    [{"v": -1}, {"v": 2**64 - 1}, {"v": 1.0}, {"v": True}, {"v": "1"}, {"w": [1]}, {"w": {2: 1}},  # 2 not in "n"
     {"w": {1: -3}}, {"w": {1: None}}],
)
def test_declaration_rejects_bad_versions(host_kp: KeyPair, extra) -> None:
    msg = {"p": host_kp.peer_id.to_bytes(), "a": [], "l": 0.0, "h": NOW, "n": {1: "ffn.1.2"}, **extra}
    with pytest.raises(DHTRecordError):
        Declaration.decode(msgpack.packb(msg, use_bin_type=True), CONFIG)


def test_tombstones_cover_every_declared_key(host_kp: KeyPair) -> None:
    uids = ["ffn.3.5.1", "ffn.4.1.1"]
    declared = {k for k, _, _, _ in make_declarations(uids, HostInfo(host_kp.peer_id), NOW, NOW + 15)}
    tombs = make_tombstones(uids, host_kp.peer_id, NOW + 15)
    assert {k for k, _, _, _ in tombs} == declared
    assert all(v is None for _, _, v, _ in tombs)


def signed(kp: KeyPair, items) -> list:
    return [sign(kp, k, s, v, e) for k, s, v, e in items]


def test_select_alive_prefers_fresh_then_light(host_kp: KeyPair) -> None:
    kps = [KeyPair.generate() for _ in range(4)]
    rows = [
        (kps[0], 5.0, NOW),  # busy
        (kps[1], 1.0, NOW - 1),  # light, fresh
        (kps[2], 0.0, NOW - 60),  # lightest but stale heartbeat
        (kps[3], 1.0, NOW),  # as light, fresher
    ]
    records = []
    for kp, load, beat in rows:
        items = make_declarations(["ffn.1"], HostInfo(kp.peer_id, load=load), beat, NOW + 15)
        records += signed(kp, [item for item in items if item[0] == b"ffn.1"])
    order = [d.peer for d in select_alive(records, NOW, CONFIG)]
    assert order == [kps[3].peer_id, kps[1].peer_id, kps[0].peer_id, kps[2].peer_id]
    assert select_alive({r.subkey: r for r in records}, NOW + 15, CONFIG) == []  # all expired


def test_select_alive_skips_tombstones_impostors_and_junk(host_kp: KeyPair) -> None:
    other = KeyPair.generate()
    good = signed(host_kp, make_declarations(["ffn.1"], HostInfo(host_kp.peer_id), NOW, NOW + 15))[0]
    tomb = sign(other, b"ffn.1", owned_subkey(other.peer_id), None, NOW + 15)
    # a host claiming to be someone else (the value names host_kp, the signer is other)
    impostor = sign(other, b"ffn.1", owned_subkey(other.peer_id), good.value, NOW + 15)
    junk = [sign(other, b"ffn.1", owned_subkey(other.peer_id, bytes([i])), v, NOW + 15)
            for i, v in enumerate([b"\xc1", msgpack.packb([1]), msgpack.packb({"p": b"x", "l": 0, "h": 0})])]
    alive = select_alive([good, tomb, impostor, *junk], NOW, CONFIG)
    assert [d.peer for d in alive] == [host_kp.peer_id]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_declaration_decode_only_typed_errors(data: bytes) -> None:
    try:
        Declaration.decode(data, CONFIG)
    except DHTRecordError:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["p", "a", "l", "h", "n", "v", "w"]),
        st.recursive(
            st.none() | st.integers(-5, 5) | st.floats() | st.binary(max_size=40) | st.text(max_size=5),
            lambda x: st.lists(x, max_size=3) | st.dictionaries(st.integers(0, 3), x, max_size=3),
            max_leaves=8,
        ),
    )
)
@pytest.mark.slow
def test_declaration_decode_structured_garbage(msg) -> None:
    try:
        Declaration.decode(msgpack.packb(msg, use_bin_type=True), CONFIG)
    except DHTRecordError:
        pass


# --- beam search ---------------------------------------------------------------------------------
class FakeDHT:
    """A Storage shared by every host (signatures and caps enforced) and a get_many that counts calls."""

    def __init__(self) -> None:
        self.storage = Storage(CONFIG)
        self.calls: list[list[str]] = []

    def publish(self, kp: KeyPair, uids, load=0.0, expiration=NOW + 15, heartbeat=NOW, versions=None) -> None:
        items = make_declarations(uids, HostInfo(kp.peer_id, (b"/addr",), load), heartbeat, expiration,
                                  versions=versions)
        assert set(self.storage.store_many(signed(kp, items), NOW)) == {"ok"}

    def get_many(self, keys: list[str]) -> dict:
        self.calls.append(keys)
        return {k: self.storage.get(k.encode(), NOW) for k in keys}


@pytest.fixture(scope="module")
def grid_world():
    rng = random.Random(7)
    dht = FakeDHT()
    hosts = [KeyPair.generate() for _ in range(30)]
    served: dict[str, set] = {}
    for kp in hosts:
        uids = {f"ffn.{rng.randrange(64)}.{rng.randrange(64)}" for _ in range(10)}
        dht.publish(kp, uids, load=rng.random())
        for uid in uids:
            served.setdefault(uid, set()).add(kp.peer_id)
    dead = KeyPair.generate()  # a host whose declarations expired: never returned
    dht.publish(dead, [f"ffn.{i}.{i}" for i in range(64)], expiration=NOW + 1)
    return dht, served, rng


def score_of(uid: str, scores) -> float:
    _, coords = parse_uid(uid)
    return sum(dim[c] for dim, c in zip(scores, coords))


def test_beam_search_full_beam_is_exact(grid_world) -> None:
    dht, served, rng = grid_world
    scores = [[rng.gauss(0, 1) for _ in range(64)] for _ in range(2)]
    found = find_best_experts("ffn", scores, 64, dht.get_many, NOW + 2)
    want = sorted(served, key=lambda u: -score_of(u, scores))[:64]
    assert [m.uid for m in found] == want
    for match in found:
        assert match.score == pytest.approx(score_of(match.uid, scores))
        assert {h.peer for h in match.hosts} == served[match.uid]
        assert all(h.addrs == (b"/addr",) for h in match.hosts)


def test_beam_search_small_beam_follows_the_best_rows(grid_world) -> None:
    dht, served, rng = grid_world
    for beam in (1, 4, 8):
        scores = [[rng.gauss(0, 1) for _ in range(64)] for _ in range(2)]
        dht.calls.clear()
        search = BeamSearch("ffn.", scores, beam, NOW + 2)
        while keys := search.wanted():
            assert len(keys) <= beam
            search.feed(dht.get_many(keys), NOW + 2)
        rows = sorted({parse_uid(u)[1][0] for u in served}, key=lambda i: -scores[0][i])[:beam]
        want = sorted((u for u in served if parse_uid(u)[1][0] in rows), key=lambda u: -score_of(u, scores))[:beam]
        assert [m.uid for m in search.result()] == want
        assert search.rounds == len(dht.calls) <= 64 // beam + 1


def test_beam_search_three_dimensions() -> None:
    rng = random.Random(3)
    dht = FakeDHT()
    uids = {f"moe.{rng.randrange(8)}.{rng.randrange(8)}.{rng.randrange(8)}" for _ in range(150)}
    hosts = [KeyPair.generate() for _ in range(10)]
    per_host: dict = {}
    for i, uid in enumerate(sorted(uids)):
        per_host.setdefault(hosts[i % 10], []).append(uid)
    for kp, mine in per_host.items():
        dht.publish(kp, mine)
    scores = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(3)]
    exact = sorted(uids, key=lambda u: -score_of(u, scores))
    assert [m.uid for m in find_best_experts("moe", scores, 64, dht.get_many, NOW)] == exact[:64]
    small = find_best_experts("moe", scores, 4, dht.get_many, NOW)
    assert len(small) == 4 and len({m.uid for m in small}) == 4
    assert all(m.uid in uids and m.score == pytest.approx(score_of(m.uid, scores)) for m in small)
    assert [m.score for m in small] == sorted((m.score for m in small), reverse=True)
    assert small[0].uid == exact[0] or score_of(small[0].uid, scores) <= score_of(exact[0], scores)


def test_beam_search_flat_grid_and_empty_world() -> None:
    dht = FakeDHT()
    kp = KeyPair.generate()
    dht.publish(kp, ["flat.3", "flat.10", "flat.20"])
    scores = [[float(i % 7) for i in range(32)]]
    found = find_best_experts("flat", scores, 2, dht.get_many, NOW)
    assert [m.uid for m in found] == ["flat.20", "flat.3"]  # scores 6 and 3; flat.10 scores 3 too
    assert find_best_experts("none", [[1.0] * 64, [1.0] * 64], 4, FakeDHT().get_many, NOW) == []


def test_beam_search_results_carry_versions() -> None:
    dht = FakeDHT()
    a, b = KeyPair.generate(), KeyPair.generate()
    dht.publish(a, ["ffn.1.1", "ffn.1.2", "flat.4"], versions={"ffn.1.1": 11, "flat.4": 3})
    dht.publish(b, ["ffn.1.1"], versions={"ffn.1.1": 9})
    found = find_best_experts("ffn", [[1.0] * 4, [1.0, 2.0, 1.5]], 4, dht.get_many, NOW)
    versions = {m.uid: {h.peer: h.version for h in m.hosts} for m in found}
    assert versions == {"ffn.1.1": {a.peer_id: 11, b.peer_id: 9}, "ffn.1.2": {a.peer_id: 0}}
    flat = find_best_experts("flat", [[1.0] * 8], 1, dht.get_many, NOW)  # one dimension: uid records
    assert [(m.uid, m.hosts[0].version) for m in flat] == [("flat.4", 3)]


def test_beam_search_ignores_lying_children() -> None:
    dht = FakeDHT()
    liar, honest = KeyPair.generate(), KeyPair.generate()
    dht.publish(honest, ["ffn.1.1"])
    # hand-made prefix record listing uids that are not below the prefix, or out of the grid
    bad = Declaration(liar.peer_id, (), 0.0, NOW, ((1, "ffn.2.1"), (2, "other.1.2"), (63, "ffn.1.99"), (5, "ffn.1.50")))
    dht.storage.store(sign(liar, b"ffn.1.", owned_subkey(liar.peer_id), bad.encode(), NOW + 15), NOW)
    found = find_best_experts("ffn", [[1.0] * 4, [1.0] * 64], 8, dht.get_many, NOW)
    assert [(m.uid, [h.peer for h in m.hosts]) for m in found] == [("ffn.1.1", [honest.peer_id])]


def test_beam_search_rejects_bad_arguments() -> None:
    with pytest.raises(ExpertUIDError):
        BeamSearch("bad prefix", [[1.0]], 1, NOW)
    with pytest.raises(ExpertUIDError):
        BeamSearch("ffn", [], 1, NOW)
    with pytest.raises(ExpertUIDError):
        BeamSearch("ffn", [[1.0]], 0, NOW)


def test_declarations_carry_the_age_of_the_last_replica_sync():
    from volunteer.dht.config import MAX_SYNCED_AGE, DHTConfig
    from volunteer.dht.grid import Declaration, HostInfo, make_declarations
    from volunteer.net.identity import KeyPair

    peer = KeyPair.generate().peer_id
    config = DHTConfig()
    items = make_declarations(["ffn.0.0", "ffn.0.1"], HostInfo(peer, (), 0.0), 100.0, 115.0,
                              synced_ages={"ffn.0.0": 12.5}, config=config)
    by_key = {key: Declaration.decode(value, config) for key, _, value, _ in items}
    from volunteer.dht.grid import expert_key

    assert by_key[expert_key("ffn.0.0")].synced_age == 12.5
    assert by_key[expert_key("ffn.0.1")].synced_age is None  # never synced: the field is left out
    clamped = make_declarations(["ffn.0.0"], HostInfo(peer, (), 0.0), 100.0, 115.0,
                                synced_ages={"ffn.0.0": 1e12}, config=config)
    assert Declaration.decode(clamped[0][2], config).synced_age == MAX_SYNCED_AGE
    import msgpack
    import pytest

    from volunteer.errors import DHTRecordError

    for bad in (-1.0, float("nan"), "soon", True, 10 * MAX_SYNCED_AGE):
        value = msgpack.packb({"p": peer.to_bytes(), "a": [], "l": 0.0, "h": 1.0, "y": bad}, use_bin_type=True)
        with pytest.raises(DHTRecordError):
            Declaration.decode(value, config)


def test_prefix_records_carry_their_childrens_sync_ages_for_a_grid_walk():
    from volunteer.dht.config import MAX_SYNCED_AGE, DHTConfig
    from volunteer.dht.grid import Declaration, HostInfo, expert_key, make_declarations
    from volunteer.net.identity import KeyPair

    peer = KeyPair.generate().peer_id
    config = DHTConfig()
    items = make_declarations(["ffn.0.0", "ffn.0.1", "ffn.1.0"], HostInfo(peer, (), 0.0), 100.0, 115.0,
                              synced_ages={"ffn.0.1": 3.5, "ffn.1.0": 1e12}, config=config)
    by_key = {key: Declaration.decode(value, config) for key, _, value, _ in items}
    row = by_key[expert_key("ffn.0.")]
    assert row.child_synced_ages == ((1, 3.5),)  # ffn.0.0 never synced: left out
    assert row.for_child(1).synced_age == 3.5 and row.for_child(0).synced_age is None
    assert by_key[expert_key("ffn.1.")].for_child(0).synced_age == MAX_SYNCED_AGE  # clamped
    assert Declaration.decode(row.encode(), config) == row  # round trip
    import msgpack
    import pytest

    from volunteer.errors import DHTRecordError

    for bad in ({2: 1.0}, {1: -1.0}, {1: float("nan")}, {1: True}, {1: "1"}, [1.0], {1: 10 * MAX_SYNCED_AGE}):
        value = msgpack.packb({"p": peer.to_bytes(), "a": [], "l": 0.0, "h": 1.0, "n": {1: "ffn.0.1"}, "z": bad},
                              use_bin_type=True)
        with pytest.raises(DHTRecordError):
            Declaration.decode(value, config)


def test_select_left_names_the_signers_of_unexpired_tombstones_only(host_kp: KeyPair) -> None:
    from volunteer.dht.grid import select_left

    leaver, expired = KeyPair.generate(), KeyPair.generate()
    declared = signed(host_kp, make_declarations(["ffn.1"], HostInfo(host_kp.peer_id), NOW, NOW + 15))[0]
    tomb = sign(leaver, b"ffn.1", owned_subkey(leaver.peer_id), None, NOW + 15)
    old = sign(expired, b"ffn.1", owned_subkey(expired.peer_id), None, NOW - 1)
    assert select_left([declared, tomb, old], NOW) == {leaver.peer_id}
