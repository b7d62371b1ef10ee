"""Reading hivemind grid records (sans-I/O): which rows a uid or prefix record gives, and which
prefixes one level down it names."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.hivemind.listing import expand
from volunteer.hivemind.serializer import DictionaryValue, ValueWithExpiration
from volunteer.net.identity import KeyPair

PEER = KeyPair.generate().peer_id.to_base58()
NOW = 1000.0


def prefix_record(entries: dict) -> ValueWithExpiration:
    value = DictionaryValue()
    for coordinate, uid in entries.items():
        value.store(coordinate, (uid, PEER), NOW + 60)
    return ValueWithExpiration(value, NOW + 60)


def test_a_uid_record_is_one_row():
    out = expand("ffn.3", ValueWithExpiration(PEER, NOW + 30), NOW)
    assert [(r["uid"], r["peer_id"], r["expires_in_s"], r["load"]) for r in out.rows] == [("ffn.3", PEER, 30.0, None)]
    assert out.children == []


def test_a_flat_expert_prefix_names_its_uid():
    out = expand("ffn.3.", prefix_record({-1: "ffn.3"}), NOW)
    assert [r["uid"] for r in out.rows] == ["ffn.3"] and out.children == []


def test_a_last_level_prefix_lists_uids_and_a_deeper_one_names_subgrids():
    leaf = expand("ffn.1.2.", prefix_record({0: "ffn.1.2.0", 5: "ffn.1.2.5"}), NOW)
    assert sorted(r["uid"] for r in leaf.rows) == ["ffn.1.2.0", "ffn.1.2.5"] and leaf.children == []
    inner = expand("ffn.1.", prefix_record({2: "ffn.1.2.5", 3: "ffn.1.3.0.7"}), NOW)
    # each sample is a real expert; the subgrids below are read next
    assert sorted(r["uid"] for r in inner.rows) == ["ffn.1.2.5", "ffn.1.3.0.7"]
    assert sorted(inner.children) == ["ffn.1.2.", "ffn.1.3."]


def test_entries_that_do_not_fit_their_prefix_are_ignored():
    value = DictionaryValue()
    value.store(2, ("other.1.2", PEER), NOW + 60)  # a uid under another prefix
    value.store(3, ("ffn.1.30", PEER), NOW + 60)  # "ffn.1.3" is not a prefix of it
    value.store("4", ("ffn.1.4", PEER), NOW + 60)  # a non-integer coordinate
    value.store(True, ("ffn.1.1", PEER), NOW + 60)  # a bool is not a coordinate
    value.store(5, ("ffn.1.5", "not a peer id"), NOW + 60)
    value.store(6, "ffn.1.6", NOW + 60)  # not a (uid, peer) pair
    value.store(-1, ("ffn.2", PEER), NOW + 60)  # a flat expert of another prefix
    out = expand("ffn.1.", ValueWithExpiration(value, NOW + 60), NOW)
    assert out.rows == [] and out.children == []
    # a dictionary under a uid key, or a peer id under a prefix key, is no record of a grid
    assert expand("ffn.1", prefix_record({2: "ffn.1.2"}), NOW).rows == []
    assert expand("ffn.1.", ValueWithExpiration(PEER, NOW + 60), NOW).rows == []


# what a hostile peer can put under a grid key: any msgpack-able value, any sub-keys
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.text(max_size=12), st.binary(max_size=8),
                    st.sampled_from([PEER, "ffn.1.2", "ffn.1.2.3", "ffn.1", "ffn.2"]))
entries = st.one_of(scalars, st.tuples(scalars, scalars), st.lists(scalars, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["ffn.1.", "ffn.1", "ffn."]), st.one_of(entries, st.dictionaries(scalars.filter(lambda k: k is not None and not isinstance(k, bytes)) | st.integers(-2, 9), entries, max_size=6)))
def test_any_record_reads_without_raising_and_stays_under_its_key(key, payload):
    if isinstance(payload, dict):
        value = DictionaryValue()
        for subkey, entry in payload.items():
            value.store(subkey, entry, NOW + 60)
        found = ValueWithExpiration(value, NOW + 60)
    else:
        found = ValueWithExpiration(payload, NOW + 60)
    out = expand(key, found, NOW)
    stem = key if key.endswith(".") else key + "."
    for r in out.rows:
        assert r["uid"] == key or r["uid"].startswith(stem) or r["uid"] == key[:-1]
        assert r["peer_id"] == PEER
    assert all(child.startswith(key) and child.endswith(".") and child != key for child in out.children)
