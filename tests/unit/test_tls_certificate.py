"""libp2p TLS certificates: made, verified, and every malformed one refused cleanly."""

from __future__ import annotations

import datetime
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.errors import HandshakeError, PeerIDMismatch
from volunteer.net.identity import KeyPair
from volunteer.net.tls import (
    EXTENSION_OID,
    SIGNATURE_PREFIX,
    decode_signed_key,
    encode_signed_key,
    make_certificate,
    peer_of_certificate,
    verify_certificate,
)

NOW = 1_800_000_000.0
HOST = KeyPair.generate()
OTHER = KeyPair.generate()


def _spki(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _forge(extension_value, *, critical=False, signer=None, key=None, not_before=NOW - 60, not_after=NOW + 60):
    """A self-signed certificate with whatever extension value a test wants (a callable gets the
    certificate key and returns the value: a SignedKey over that very key)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    if callable(extension_value):
        extension_value = extension_value(key)
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.SERIAL_NUMBER, "1")])
    builder = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
        .not_valid_before(datetime.datetime.fromtimestamp(not_before, datetime.timezone.utc))
        .not_valid_after(datetime.datetime.fromtimestamp(not_after, datetime.timezone.utc))
    )
    if extension_value is not None:
        builder = builder.add_extension(x509.UnrecognizedExtension(EXTENSION_OID, extension_value), critical=critical)
    return builder.sign(signer or key, hashes.SHA256()), key


def _signed_key_for(cert_key, identity=HOST, prefix=SIGNATURE_PREFIX) -> bytes:
    signature = identity.sign(prefix + _spki(cert_key.public_key()))
    return encode_signed_key(identity.public_key.to_protobuf(), signature)


def test_our_certificate_proves_our_peer_id():
    cert = make_certificate(HOST, now=NOW)
    assert verify_certificate(cert.der, now=NOW) == HOST.public_key
    assert peer_of_certificate(cert.certificate, now=NOW + 86400 * 365, expected=HOST.peer_id) == HOST.peer_id
    # an hour back for peers whose clocks run behind
    assert peer_of_certificate(cert.der, now=NOW - 1800) == HOST.peer_id


def test_a_certificate_for_someone_else_is_a_mismatch():
    cert = make_certificate(OTHER, now=NOW)
    with pytest.raises(PeerIDMismatch):
        peer_of_certificate(cert.der, now=NOW, expected=HOST.peer_id)


def test_signed_key_round_trips_with_long_forms():
    for size in (0, 5, 127, 128, 255, 256, 1000):
        blob = bytes(range(256)) * 4
        assert decode_signed_key(encode_signed_key(blob[:size], b"s" * 64)) == (blob[:size], b"s" * 64)


def test_a_forged_certificate_fails():
    # the extension vouches for another certificate key: the signature does not cover ours
    _, other_key = _forge(None)
    cert, _ = _forge(_signed_key_for(other_key))
    with pytest.raises(HandshakeError, match="does not verify"):
        verify_certificate(cert, now=NOW)
    # signed over the right key with the wrong prefix
    wrong_prefix, _ = _forge(lambda key: _signed_key_for(key, prefix=b"libp2p-tls:"))
    with pytest.raises(HandshakeError, match="does not verify"):
        verify_certificate(wrong_prefix, now=NOW)


def test_expired_missing_duplicated_and_not_self_signed_are_refused():
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(HandshakeError, match="valid from"):
        verify_certificate(make_certificate(HOST, now=NOW).der, now=NOW - 7200)
    with pytest.raises(HandshakeError, match="0 libp2p extensions"):
        verify_certificate(_forge(None)[0], now=NOW)
    with pytest.raises(HandshakeError, match="self-signed"):
        verify_certificate(_forge(b"\x30\x00", signer=key)[0], now=NOW)
    with pytest.raises(HandshakeError, match="does not parse"):
        verify_certificate(b"\x30\x03\x02\x01\x00", now=NOW)
    with pytest.raises(HandshakeError, match="exceeds"):
        verify_certificate(b"\x00" * 20000, now=NOW)


def test_a_critical_extension_still_verifies():
    cert, _ = _forge(_signed_key_for, critical=True)
    assert verify_certificate(cert, now=NOW) == HOST.public_key


@given(st.binary(max_size=600))
@settings(max_examples=300, deadline=None)
def test_random_signed_keys_never_crash(data):
    try:
        public_key, signature = decode_signed_key(data)
    except HandshakeError:
        return
    assert encode_signed_key(public_key, signature) == data  # only canonical DER is accepted


@given(st.binary(max_size=300))
@settings(max_examples=60, deadline=None)
def test_random_extension_values_are_a_clean_handshake_error(value):
    cert, _ = _forge(value)
    with pytest.raises(HandshakeError):
        verify_certificate(cert, now=NOW)


@given(st.binary(max_size=2000))
@settings(max_examples=200, deadline=None)
def test_random_certificate_bytes_are_a_clean_handshake_error(data):
    with pytest.raises(HandshakeError):
        verify_certificate(data, now=NOW)


def test_certificate_uses_the_wall_clock_only_through_now():
    # make_certificate takes the time it is told: a certificate made "in 2030" is not valid today
    cert = make_certificate(HOST, now=time.time() + 10 * 365 * 86400)
    with pytest.raises(HandshakeError):
        verify_certificate(cert.der, now=time.time())
