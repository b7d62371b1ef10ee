"""Make and verify libp2p TLS certificates. Pure: no sockets, and the time is passed in.

The certificate is self-signed with an ephemeral ECDSA P-256 key (unrelated to the host key, as
the spec asks). Its extension ``1.3.6.1.4.1.53594.1.1`` holds the DER of

    SignedKey ::= SEQUENCE { publicKey OCTET STRING, signature OCTET STRING }

where ``publicKey`` is the host's libp2p ``PublicKey`` protobuf and ``signature`` is the host
key's signature over ``"libp2p-tls-handshake:" || SubjectPublicKeyInfo(certificate key)``.
Whatever a peer sends is parsed with bounds on every length; anything malformed is a
``HandshakeError``, never another exception.
"""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ...errors import HandshakeError, PeerIDError, PeerIDMismatch
from .. import limits
from ..identity import KeyPair, PeerID, PublicKey

ALPN = "libp2p"
EXTENSION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.1")
SIGNATURE_PREFIX = b"libp2p-tls-handshake:"

_SEQUENCE = 0x30
_OCTET_STRING = 0x04


@dataclass(frozen=True)
class Certificate:
    """Our certificate for one host key, and the private key of the certificate (not the host's)."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def der(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.DER)


# --- DER: just the two shapes SignedKey needs ---------------------------------------------------
def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    body = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(body)) + body


def _read_tlv(data: bytes, offset: int, tag: int, what: str) -> tuple[bytes, int]:
    """The value of the DER element of ``tag`` at ``offset``, and the offset after it."""
    if offset + 2 > len(data):
        raise HandshakeError(f"libp2p certificate extension: {what} is truncated")
    if data[offset] != tag:
        raise HandshakeError(f"libp2p certificate extension: {what} has tag {data[offset]:#x}, not {tag:#x}")
    first = data[offset + 1]
    offset += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        # DER lengths are minimal; more than two length bytes cannot fit TLS_MAX_SIGNED_KEY anyway
        if count == 0 or count > 2 or offset + count > len(data):
            raise HandshakeError(f"libp2p certificate extension: bad length of {what}")
        length = int.from_bytes(data[offset : offset + count], "big")
        if length < 0x80 or (count == 2 and length < 0x100):
            raise HandshakeError(f"libp2p certificate extension: non-minimal length of {what}")
        offset += count
    if offset + length > len(data):
        raise HandshakeError(f"libp2p certificate extension: {what} is truncated")
    return data[offset : offset + length], offset + length


def encode_signed_key(public_key: bytes, signature: bytes) -> bytes:
    """DER ``SignedKey`` of a public key protobuf and a signature."""
    return _der(_SEQUENCE, _der(_OCTET_STRING, public_key) + _der(_OCTET_STRING, signature))


def decode_signed_key(data: bytes) -> tuple[bytes, bytes]:
    """(public key protobuf, signature) of a DER ``SignedKey``; HandshakeError if malformed."""
    data = bytes(data)
    if len(data) > limits.TLS_MAX_SIGNED_KEY:
        raise HandshakeError(f"libp2p certificate extension of {len(data)} bytes exceeds {limits.TLS_MAX_SIGNED_KEY}")
    body, end = _read_tlv(data, 0, _SEQUENCE, "SignedKey")
    if end != len(data):
        raise HandshakeError("libp2p certificate extension: bytes after SignedKey")
    public_key, offset = _read_tlv(body, 0, _OCTET_STRING, "publicKey")
    signature, offset = _read_tlv(body, offset, _OCTET_STRING, "signature")
    if offset != len(body):
        raise HandshakeError("libp2p certificate extension: extra fields in SignedKey")
    return public_key, signature


# --- certificates -----------------------------------------------------------------------------
def _utc(unix_seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(unix_seconds, tz=datetime.timezone.utc)


def _subject_public_key_info(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def make_certificate(identity: KeyPair, *, now: float) -> Certificate:
    """A fresh self-signed certificate proving ``identity``, valid from an hour before ``now``
    (unix seconds; peers' clocks disagree) for TLS_CERT_LIFETIME."""
    key = ec.generate_private_key(ec.SECP256R1())
    signature = identity.sign(SIGNATURE_PREFIX + _subject_public_key_info(key.public_key()))
    extension = x509.UnrecognizedExtension(EXTENSION_OID, encode_signed_key(identity.public_key.to_protobuf(), signature))
    serial = secrets.randbits(63) + 1
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.SERIAL_NUMBER, str(serial))])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(_utc(now - limits.TLS_CERT_BACKDATE))
        .not_valid_after(_utc(now + limits.TLS_CERT_LIFETIME))
        .add_extension(extension, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Certificate(certificate, key)


def verify_certificate(certificate: x509.Certificate | bytes, *, now: float) -> PublicKey:
    """The host key a peer's certificate proves (spec: self-signed, valid at ``now`` in unix
    seconds, the extension's signature by that host key over the certificate key).
    HandshakeError for anything else."""
    if isinstance(certificate, (bytes, bytearray, memoryview)):
        if len(certificate) > limits.TLS_MAX_CERTIFICATE:
            raise HandshakeError(f"peer certificate of {len(certificate)} bytes exceeds {limits.TLS_MAX_CERTIFICATE}")
        try:
            certificate = x509.load_der_x509_certificate(bytes(certificate))
        except ValueError as exc:
            raise HandshakeError(f"peer certificate does not parse: {exc}") from None
    try:
        valid_from, valid_until = certificate.not_valid_before_utc, certificate.not_valid_after_utc
        at = _utc(now)
        if not valid_from <= at <= valid_until:
            raise HandshakeError(f"peer certificate is valid from {valid_from} until {valid_until}, not now ({at})")
        try:
            certificate.verify_directly_issued_by(certificate)
        except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise HandshakeError(f"peer certificate is not properly self-signed: {exc or type(exc).__name__}") from None
        matches = [ext for ext in certificate.extensions if ext.oid == EXTENSION_OID]
        if len(matches) != 1:
            raise HandshakeError(f"peer certificate carries {len(matches)} libp2p extensions, not 1")
        value = matches[0].value
        raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
        public_key_bytes, signature = decode_signed_key(raw)
        try:
            host_key = PublicKey.from_protobuf(public_key_bytes)
        except PeerIDError as exc:
            raise HandshakeError(f"peer certificate's host key: {exc}") from None
        signed = SIGNATURE_PREFIX + _subject_public_key_info(certificate.public_key())
    except HandshakeError:
        raise
    except (ValueError, TypeError, UnsupportedAlgorithm, x509.DuplicateExtension) as exc:
        # cryptography parses lazily: a field it cannot read surfaces only when touched
        raise HandshakeError(f"peer certificate is malformed: {exc}") from None
    if not host_key.verify(signed, signature):
        raise HandshakeError("peer certificate's libp2p signature does not verify")
    return host_key


def peer_of_certificate(certificate: x509.Certificate | bytes, *, now: float, expected: PeerID | None = None) -> PeerID:
    """The PeerID a certificate proves; ``PeerIDMismatch`` when it is not ``expected``."""
    peer = PeerID.from_public_key(verify_certificate(certificate, now=now))
    if expected is not None and peer != expected:
        raise PeerIDMismatch(f"dialled {expected} but {peer} answered")
    return peer


__all__ = [
    "ALPN",
    "EXTENSION_OID",
    "SIGNATURE_PREFIX",
    "Certificate",
    "decode_signed_key",
    "encode_signed_key",
    "make_certificate",
    "peer_of_certificate",
    "verify_certificate",
]
