"""PeerIDs and keys against the libp2p peer-ids spec's test vectors; key files."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import KeyFileError, PeerIDError
from volunteer.net.identity import (
    ED25519,
    SECP256K1,
    KeyPair,
    PeerID,
    PublicKey,
    load_keypair,
    load_or_create_keypair,
    save_keypair,
)

# From the peer-ids spec (and rust-libp2p's keypair tests).
ED25519_SEED = bytes.fromhex("7e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d")
ED25519_PRIVATE_PB = bytes.fromhex(
    "080112407e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d"
    "1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e"
)
ED25519_PUBLIC_PB = bytes.fromhex("080112201ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e")
ED25519_PEER_ID = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"
SECP256K1_PUBLIC_PB = bytes.fromhex("08021221037777e994e452c21604f91de093ce415f5432f701dd8cd1a7a6fea0e630bfca99")
ECDSA_PUBLIC_PB = bytes.fromhex(
    "0803125b3059301306072a8648ce3d020106082a8648ce3d03010703420004de3d300fa36ae0e8f5d530899d83abab"
    "44abf3161f162a4bc901d8e6ecda020e8b6d5f8da30525e71d6851510c098e5c47c646a597fb4dcec034e9f77c409e62"
)
RSA_PUBLIC_PB_PREFIX = bytes.fromhex("080012a602")  # type RSA, 294-byte DER key follows


def test_ed25519_spec_vectors():
    keypair = KeyPair.from_seed(ED25519_SEED)
    assert keypair.public_key.to_protobuf() == ED25519_PUBLIC_PB
    assert keypair.to_protobuf() == ED25519_PRIVATE_PB
    assert str(keypair.peer_id) == ED25519_PEER_ID
    assert KeyPair.from_protobuf(ED25519_PRIVATE_PB).peer_id == keypair.peer_id
    assert PublicKey.from_protobuf(ED25519_PUBLIC_PB) == keypair.public_key
    # Identity multihash: the key can be read back out of the ID.
    assert keypair.peer_id.to_bytes()[:2] == b"\x00\x24"
    assert keypair.peer_id.extract_public_key() == keypair.public_key


def test_cid_and_base58_forms_are_the_same_peer():
    peer = PeerID.from_string(ED25519_PEER_ID)
    cid = peer.to_cid()
    assert cid.startswith("bafz")
    assert PeerID.from_string(cid) == peer
    assert PeerID.from_string(ED25519_PEER_ID.strip()) == peer


def test_other_key_types_parse_and_hash_per_spec():
    secp = PublicKey.from_protobuf(SECP256K1_PUBLIC_PB)
    assert secp.key_type == SECP256K1 and secp.to_protobuf() == SECP256K1_PUBLIC_PB
    assert str(PeerID.from_public_key(secp)).startswith("16Uiu2")  # inlined (≤ 42 bytes)
    ecdsa = PublicKey.from_protobuf(ECDSA_PUBLIC_PB)
    ecdsa_id = PeerID.from_public_key(ecdsa)
    assert ecdsa_id.to_bytes()[:2] == b"\x12\x20"  # > 42 bytes: sha2-256 multihash
    assert str(ecdsa_id).startswith("Qm")
    assert ecdsa_id.extract_public_key() is None and ecdsa_id.matches(ecdsa)


def test_rsa_and_ecdsa_signatures_verify():
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = rsa_key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    public = PublicKey(0, der)
    signature = rsa_key.sign(b"hello", padding.PKCS1v15(), hashes.SHA256())
    assert public.verify(b"hello", signature) and not public.verify(b"hellp", signature)
    assert str(PeerID.from_public_key(public)).startswith("Qm")

    ec_key = ec.generate_private_key(ec.SECP256K1())
    point = ec_key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    public = PublicKey(SECP256K1, point)
    assert public.verify(b"x", ec_key.sign(b"x", ec.ECDSA(hashes.SHA256())))
    assert not public.verify(b"x", b"garbage")


def test_sign_and_verify():
    keypair = KeyPair.generate()
    signature = keypair.sign(b"payload")
    assert keypair.public_key.verify(b"payload", signature)
    assert not keypair.public_key.verify(b"payloaD", signature)
    assert keypair.public_key.key_type == ED25519


@pytest.mark.parametrize("text", ["", "12D3KooW", "Qm" + "1" * 44, "bafzbad", "xyz", "zzzzzzz", "b" + "a" * 20])
def test_bad_peer_ids_are_refused(text):
    with pytest.raises(PeerIDError):
        PeerID.from_string(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash_decoders(data):
    for decode in (PeerID.from_bytes, PublicKey.from_protobuf, KeyPair.from_protobuf):
        try:
            decode(data)
        except PeerIDError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_random_text_never_crashes(text):
    try:
        PeerID.from_string(text)
    except PeerIDError:
        pass


def test_key_file_roundtrip_and_permissions(tmp_path):
    path = tmp_path / "sub" / "id.key"
    keypair, created = load_or_create_keypair(path)
    assert created and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    again, created = load_or_create_keypair(path)
    assert not created and again.peer_id == keypair.peer_id
    os.chmod(path, 0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_keypair(path)
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError):
        load_keypair(path)
    with pytest.raises(KeyFileError, match="does not exist"):
        load_keypair(tmp_path / "missing.key")
    other = KeyPair.generate()
    save_keypair(path, other)
    assert load_keypair(path).peer_id == other.peer_id


def test_signed_by_holds_only_for_the_named_key_and_message_and_refuses_malformed_peer_ids():
    from volunteer.net.identity import KeyPair, signed_by

    alice, bob = KeyPair.generate(), KeyPair.generate()
    signature = alice.sign(b"record")
    assert signed_by(alice.peer_id.to_bytes(), b"record", signature)
    assert not signed_by(bob.peer_id.to_bytes(), b"record", signature)
    assert not signed_by(alice.peer_id.to_bytes(), b"other record", signature)
    assert not signed_by(b"\x00\x01not a peer id", b"record", signature)
